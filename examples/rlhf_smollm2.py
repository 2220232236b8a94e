"""RLHF from Python on SmolLM2-135M-Instruct, the three stages people run: a reward model on
preference pairs, DPO on the same pairs, and PPO against the reward model (critic initialised from
it, KL to the base model). The pairs are synthetic (right vs wrong sums, concise vs rambling
replies), written on first use, so nothing is downloaded.

    python examples/rlhf_smollm2.py [--quick]
"""

import sys

from lmrl import DPOTrainer, PPOTrainer, RewardTrainer, load_config

quick = "--quick" in sys.argv
small = ["train.max_steps=2", "data.batch_size=4", "data.eval_size=8", "data.generate_train=32",
         "data.generate_test=8", "data.train_file=data/prefs/train.jsonl", "data.eval_file=data/prefs/test.jsonl",
         "train.eval_every=2"] if quick else []

rm = RewardTrainer(load_config("rm-smollm2", small)).train()
print(f"reward model: held-out preference accuracy {rm['final']['eval/accuracy']:.3f} ({rm['exported']})")

dpo = DPOTrainer(load_config("dpo-smollm2", small)).train()
print(f"DPO: held-out preference accuracy {dpo['final']['eval/accuracy']:.3f}")

ppo_quick = ["train.steps=1", "train.rollout_size=4", "algo.minibatch_size=4", "task.max_new_tokens=8",
             "eval.size=4", "eval.batch_size=4", "task.train_file=data/prefs/train.jsonl",
             "task.test_file=data/prefs/test.jsonl"] if quick else []
ppo = PPOTrainer(load_config("ppo-rm-smollm2", [f"reward.model={rm['exported']}", *ppo_quick])).train()
print(f"PPO: held-out reward-model score {ppo['start_eval']['eval/reward']:.3f} before, "
      f"{ppo['final_eval']['eval/reward']:.3f} after RL")
