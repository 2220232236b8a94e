"""The main job from Python: the `adder` preset, edited as a dataclass, trained by RLTrainer.

    python examples/train_adder.py              # the full preset (minutes on a laptop CPU)
    python examples/train_adder.py --quick      # a few seconds, to see every stage run
"""

import sys

from lmrl import AdderRLConfig, RLTrainer

cfg = AdderRLConfig()  # ≡ load_config("adder"); every field is a plain attribute
cfg.run.name = "adder-example"
if "--quick" in sys.argv:
    cfg.sft.steps, cfg.sft.examples, cfg.sft.batch_size = 5, 64, 32
    cfg.train.steps, cfg.train.rollout_size, cfg.train.eval_every = 5, 32, 5
    cfg.eval.size = 100

summary = RLTrainer(cfg).train()
print(f"held-out accuracy after the warm-up: {summary['warmup_accuracy']:.3f}, "
      f"after RL: {summary['final_accuracy']:.3f} ({summary['sft_examples']} labeled problems used)")
