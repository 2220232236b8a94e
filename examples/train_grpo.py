"""GRPO from Python, TRL-style: a config, a trainer named after its algorithm, a reward function.

Starts from the `adder-grpo` preset (the adder's warm-up, then 4 samples per prompt with
group-normalised advantages) and swaps in a user reward: 1 for an exact answer, else 0.

    python examples/train_grpo.py [--quick]
"""

import sys

from lmrl import GRPOTrainer, load_config


def exact_answer(prompts: list[str], completions: list[str]) -> list[float]:
    """1.0 when the completion is the sum, least-significant digit first, else 0.0."""
    rewards = []
    for prompt, completion in zip(prompts, completions):
        a, b = prompt.rstrip("=").split("+")
        rewards.append(float(completion == str(int(a) + int(b)).zfill(len(completion))[::-1]))
    return rewards


cfg = load_config("adder-grpo", ["run.name=adder-grpo-exact"])
if "--quick" in sys.argv:
    cfg.sft.steps, cfg.sft.examples, cfg.sft.batch_size = 5, 64, 32
    cfg.train.steps, cfg.train.rollout_size, cfg.train.eval_every = 5, 32, 5
    cfg.eval.size = 100

summary = GRPOTrainer(cfg, reward_fn=exact_answer).train()
print(f"warm-up {summary['warmup_accuracy']:.3f} → after RL {summary['final_accuracy']:.3f}")
