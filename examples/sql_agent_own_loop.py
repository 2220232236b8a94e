"""RL for a SQL agent from your own agent loop: you play the episodes, lmrl updates the LoRA adapter.

    python examples/sql_agent_own_loop.py [--model smollm2-135m-instruct] [--episodes 16] [--quick]

The loop below is yours to replace (tools, prompts, stopping rules): it only has to hand each
finished conversation and its reward to `EpisodeLearner.add_episode`. For the built-in loop, run
`lmrl train sql-agent-smollm2` (or `RLTrainer(load_config("sql-agent-smollm2")).train()`); a
`Callback` there sees every episode the trainer plays.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from lmrl.models.hf import load_hf_policy
from lmrl.models.lora import add_lora
from lmrl.tasks.sql import ProceduralSQLTasks, SQLEnv, SQLEnvConfig
from lmrl.tasks.sql.agent_task import episode_preamble
from lmrl.train.online import EpisodeLearner, EpisodeLearnerConfig


def play(policy, env: SQLEnv, task, max_new_tokens: int = 96, greedy: bool = False) -> tuple[list[dict], float]:
    """One episode, one turn at a time: sample a reply, step the environment, append both. The
    system prompt and worked example come first (its turns say "training": false: no loss)."""
    messages = [*episode_preamble(env.config), {"role": "user", "content": env.reset(task)}]
    total, done = 0.0, False
    while not done:
        _, completion, keep, _ = policy.generate_text(
            [policy.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)],
            max_new_tokens, temperature=0.7, greedy=greedy)
        reply = policy.tokenizer.decode(completion[0][keep[0].bool()], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": reply})
        observation, reward, done, info = env.step(reply)
        total += reward
        if not done:
            messages.append({"role": "user", "content": observation})
    return messages, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--run-dir", default="runs/sql-own-loop")
    parser.add_argument("--quick", action="store_true", help="2 short episodes, 1 update (a smoke test)")
    args = parser.parse_args()
    episodes, batch, rounds, tokens, n_eval = (2, 2, 1, 16, 2) if args.quick else (args.episodes, 8, 4, 96, 24)
    torch.manual_seed(0)
    policy, _ = load_hf_policy(args.model)
    policy = add_lora(policy, r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    learner = EpisodeLearner(policy, EpisodeLearnerConfig(lr=2e-4, batch_episodes=batch, run_dir=args.run_dir))
    if learner.resumed_from:
        print(f"resumed from {learner.resumed_from}")
    env, tasks = SQLEnv(SQLEnvConfig(max_rounds=rounds)), ProceduralSQLTasks(seed=0)
    heldout = ProceduralSQLTasks(seed=1, split="heldout").take(n_eval)

    def success() -> float:
        return sum(play(policy, env, t, tokens, greedy=True)[1] > 0 for t in heldout) / len(heldout)

    before = success()
    for i in range(episodes):
        messages, reward = play(policy, env, tasks.sample(), tokens)
        metrics = learner.add_episode(messages, reward)
        print(f"episode {i + 1}: reward {reward:+.2f}, {len(messages) // 2 - 2} turns")
        if metrics:
            print(f"  update {metrics['step']}: loss {metrics['train/policy_loss']:.4f}, "
                  f"mean reward {metrics['train/avg_reward']:+.3f}")
    after = success()
    print(f"success on {n_eval} held-out tasks: base model {before:.3f} → after RL {after:.3f}")
    summary = {"heldout_success_before": before, "heldout_success_after": after, **learner.state}
    (Path(args.run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
