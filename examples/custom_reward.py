"""A user reward function in place of the task's verifier (TRL-style: texts in, floats out).

The reward below gives partial credit per correct digit and reads nothing but the prompt and the
completion, as any reward for RL must: the answer is recomputed from the prompt's operands.

    python examples/custom_reward.py [--quick]
"""

import sys

from lmrl import AdderRLConfig, RLTrainer


def digit_credit(prompts: list[str], completions: list[str]) -> list[float]:
    """Fraction of answer digits in the right place; answers are written least-significant first."""
    rewards = []
    for prompt, completion in zip(prompts, completions):
        a, b = prompt.rstrip("=").split("+")
        expected = str(int(a) + int(b)).zfill(len(completion))[::-1]
        rewards.append(sum(x == y for x, y in zip(completion, expected)) / len(expected))
    return rewards


cfg = AdderRLConfig()
cfg.run.name = "adder-digit-credit"
if "--quick" in sys.argv:
    cfg.sft.steps, cfg.sft.examples, cfg.sft.batch_size = 5, 64, 32
    cfg.train.steps, cfg.train.rollout_size, cfg.train.eval_every = 5, 32, 5
    cfg.eval.size = 100

summary = RLTrainer(cfg, reward_fn=digit_credit).train()
print(f"warm-up {summary['warmup_accuracy']:.3f} → after RL {summary['final_accuracy']:.3f}")
