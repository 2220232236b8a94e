"""User reward functions in place of the task's verifier, written as TRL writes them: keyword
arguments in (`prompts`, `completions`, `completion_ids`, `trainer_state`, `log_metric`, `log_extra`
and the task's columns: take **kwargs), one float per completion out, or None where a function does
not apply. The functions' weighted sum is the reward; each one's mean is reported as
rewards/<name>/mean. With `train.log_completions` every logged step's completions go to
runs/adder-digit-credit/completions.jsonl, each with its reward, each function's, its advantage and
the columns the functions add with `log_extra` (here `carry`); `train.completions_to_print` prints a few.

Both rewards read nothing but the prompt and the completion, as any reward for RL must: the answer
is recomputed from the prompt's operands. From a config file the same run is

    reward:
      funcs: [my_rewards:digit_credit, my_rewards:carry_bonus]
      weights: [1.0, 0.5]

    python examples/custom_reward.py [--quick]
"""

import sys

from lmrl import AdderRLConfig, RLTrainer


def expected_answer(prompt: str, width: int) -> str:
    """The sum of the prompt's operands ("12+34="), zero-padded to `width` and least-significant first."""
    a, b = prompt.rstrip("=").split("+")
    return str(int(a) + int(b)).zfill(width)[::-1]


def digit_credit(prompts, completions, **kwargs):
    """Fraction of answer digits in the right place."""
    return [sum(x == y for x, y in zip(c, expected_answer(p, len(c)))) / len(c) for p, c in zip(prompts, completions)]


def carry_bonus(prompts, completions, log_extra, **kwargs):
    """1.0 for a whole right answer to a sum with a carry, else 0.0; None (not applicable) for sums
    without one, so the easy problems are left to digit_credit. Whether each sum carries goes to the
    completions log as the column `carry`."""
    rewards, carry = [], []
    for p, c in zip(prompts, completions):
        a, b = p.rstrip("=").split("+")
        carries = any(int(x) + int(y) > 9 for x, y in zip(a[::-1], b[::-1]))
        carry.append(carries)
        rewards.append(float(c == expected_answer(p, len(c))) if carries else None)
    log_extra("carry", carry)
    return rewards


cfg = AdderRLConfig()
cfg.run.name = "adder-digit-credit"
cfg.train.log_completions, cfg.train.completions_to_print = True, 2
if "--quick" in sys.argv:
    cfg.sft.steps, cfg.sft.examples, cfg.sft.batch_size = 5, 64, 32
    cfg.train.steps, cfg.train.rollout_size, cfg.train.eval_every = 5, 32, 5
    cfg.eval.size = 100

summary = RLTrainer(cfg, reward_funcs=[digit_credit, carry_bonus], reward_weights=[1.0, 0.5]).train()
print(f"warm-up {summary['warmup_accuracy']:.3f} → after RL {summary['final_accuracy']:.3f}")
