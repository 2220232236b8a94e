"""How many operations a GRPO step launches, per decoder layer: the CPU-side measure of a GPU step
that is bound by launching kernels rather than by running them.

    python -m benchmarks.launch_count [--rows 64] [--group 8] [--ga-steps 8] [--new-tokens 32]   # from the repo root

On a GPU, eager PyTorch pays each aten operation's dispatch and launch on the host (17-23 us an
operation on the H100 machine of docs/results.md), so a small model's decode step and update cost
operations x that, whatever the GPU could do. The counts do not depend on the device or the widths,
only on the code path and the number of layers, so they are taken here, on the CPU, with a
`TorchDispatchMode` that counts every aten call (views included: each costs a dispatch too) and the
host syncs among them (`.item()`, `int(tensor)`, `bool(tensor)`). The sampling loop runs as it does on
a GPU: without the CPU's oneDNN packing, so LoRA adapters run unmerged.

The model is the device check's SmolLM2 architecture and tokenizer at a tiny width (scripts/gpu_check.py),
built at 2 and at 6 layers; per-layer counts are the difference over the 4 extra layers, the fixed part
what remains. One GRPO step of the `math-grpo-qwen-gpu` preset as the device check runs it (open
prompts, `algo.skip_zero_advantage=false`), LoRA r 32 on every projection, for each arm:

  rollout           the sampling loop (`HFPolicy.generate_ids`): operations per layer and decode step
                    (the prefill's spread over the step's tokens)
  rollout (static)  the same over a static cache from fixed buffers, the step a GPU replays as one CUDA
                    graph (`generation/decode_graph.py`); here it runs eagerly, so this is what one
                    replay holds
  update            `algo.prepare` and `algo.update`: operations per layer and micro-batch, with the
                    learner's shared-prompt pass (no gradient checkpointing), under gradient checkpointing
                    (one pass, recomputed), plain (`algo.group_size=1` under REINFORCE, no prompt repeats:
                    the rows' common start runs once, 2 passes), and one pass (sharing off, as a small model
                    on a GPU runs)
  no LoRA           the same arms training every weight (`lora.r=0`)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import io
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
DEPTHS = (2, 6)  # decoder layers of the two builds whose counts give the per-layer slope
SYNC_OPS = ("aten._local_scalar_dense", "aten.item", "aten.is_nonzero")  # item: as dispatched in inference mode


class OpCount(TorchDispatchMode):
    """Counts aten calls by name while active."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count_step(work: Path, layers: int, args, *, lora_r: int, checkpointing: bool, static: bool,
               group: int | None = None, share: bool = True) -> dict:
    """Operation counts of one GRPO step's rollout and update (totals, and syncs) at `layers` layers."""
    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    import gpu_check

    shape = gpu_check.TINY_SHAPE
    gpu_check.TINY_SHAPE = {**shape, "num_hidden_layers": layers}
    try:
        return _count_step(gpu_check, work, layers, args, lora_r=lora_r, checkpointing=checkpointing,
                           static=static, group=group or args.group, share=share)
    finally:
        gpu_check.TINY_SHAPE = shape


def _count_step(gpu_check, work: Path, layers: int, args, *, lora_r: int, checkpointing: bool, static: bool,
                group: int, share: bool) -> dict:
    import lmrl.models.hf as hf
    from lmrl.config import load_config
    from lmrl.train.rl_trainer import RLTrainer

    home = work / f"{layers}-layers"
    run_dir = home / f"run-r{lora_r}-gc{int(checkpointing)}-s{int(static)}-g{group}-p{int(share)}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = gpu_check.grpo_overrides("smollm2", home, True, run_dir) + [
        "train.steps=1", f"train.rollout_size={args.rows}", f"algo.group_size={group}",
        f"train.ga_steps={args.ga_steps}", f"task.max_new_tokens={args.new_tokens}", f"lora.r={lora_r}",
        f"model.gradient_checkpointing={str(checkpointing).lower()}", "run.threads=1"]
    if group == 1:  # GRPO compares within groups: REINFORCE, whose batches repeat no prompt
        overrides.append("algo.name=reinforce")
    log = io.StringIO()  # the trainer's log lines, shown if it fails
    try:
        with contextlib.redirect_stderr(log):
            trainer = RLTrainer(load_config("math-grpo-qwen-gpu", overrides))
    except Exception:
        sys.stderr.write(log.getvalue())
        raise
    trainer.model.share_prompts = share
    found: dict[str, collections.Counter] = {}
    seen: set[str] = set()

    def counted(obj, name: str, label: str, keep) -> None:
        """Counts the operations of `obj.name`'s first call that `keep`s its arguments into `label`."""
        method = getattr(obj, name)

        @functools.wraps(method)
        def run(*a, **k):
            with OpCount() as mode:
                out = method(*a, **k)
            if name not in seen and keep(*a):
                seen.add(name)
                found[label] = found.get(label, collections.Counter()) + mode.ops
            return out
        setattr(obj, name, run)

    build = trainer.build_rl_modules

    def build_counted():
        build()
        counted(trainer.algo, "prepare", "update", lambda *a: True)  # the reference's pass, advantages
        counted(trainer.algo, "update", "update", lambda *a: True)
    trainer.build_rl_modules = build_counted
    # the step's rollout, not the evaluations' (another batch size)
    counted(trainer.model, "generate_ids", "rollout", lambda ids, *a: ids.size(0) == args.rows)
    plain = hf.generate
    # as on a GPU: no oneDNN packing, so LoRA adapters run unmerged; `static`: the CUDA-graph step, run eagerly
    graph_step = dict(cache="static", compact_at=None) if static else {}
    hf.generate = functools.partial(plain, pack_weights=False, **graph_step)
    try:
        with contextlib.redirect_stderr(log):
            trainer.train()
    except Exception:
        sys.stderr.write(log.getvalue())
        raise
    finally:
        hf.generate = plain
    return found


def per_layer(small: collections.Counter, large: collections.Counter, depths: tuple[int, int], per: float):
    """(operations per layer, fixed operations, host syncs), each per `per` (decode steps or micro-batches),
    from the counts of the same run at two depths: the slope, and what the slope leaves of the smaller."""
    total = lambda c: sum(c.values())  # noqa: E731
    syncs = lambda c: sum(c[name] for name in SYNC_OPS)  # noqa: E731
    layer = (total(large) - total(small)) / (depths[1] - depths[0]) / per
    fixed = total(small) / per - depths[0] * layer
    return layer, fixed, syncs(small) / per


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=64, help="completions a step (train.rollout_size)")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (algo.group_size)")
    p.add_argument("--ga-steps", type=int, default=8, help="micro-batches a step (train.ga_steps)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens sampled per completion (random weights "
                                                               "rarely end early; the prefill is spread over them)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    lora, full = dict(lora_r=32), dict(lora_r=0)
    shared, checkpointed, plain = (dict(checkpointing=False, static=False), dict(checkpointing=True, static=False),
                                   dict(checkpointing=False, static=False, group=1))
    one = dict(checkpointing=False, static=False, share=False)
    arms = {"rollout, LoRA r 32": {**lora, **shared},
            "rollout (static), LoRA r 32": {**lora, **shared, "static": True},
            "rollout, no LoRA": {**full, **shared},
            "update, shared prompts, LoRA r 32": {**lora, **shared},
            "update, checkpointed, LoRA r 32": {**lora, **checkpointed},
            "update, plain, LoRA r 32": {**lora, **plain},
            "update, shared prompts, no LoRA": {**full, **shared},
            "update, checkpointed, no LoRA": {**full, **checkpointed},
            "update, plain, no LoRA": {**full, **plain},
            "update, one pass, LoRA r 32": {**lora, **one},
            "update, one pass, no LoRA": {**full, **one}}
    work = Path(tempfile.mkdtemp(prefix="lmrl-launch-count-"))
    runs: dict[tuple, dict] = {}
    print(f"{'arm':36s}{'ops/layer':>11s}{'fixed':>9s}{'syncs':>8s}   (per decode step, or per micro-batch)")
    for name, kw in arms.items():
        key = tuple(sorted(kw.items()))
        if key not in runs:
            runs[key] = {n: count_step(work, n, args, **kw) for n in DEPTHS}
        small, large = (runs[key][n] for n in DEPTHS)
        phase = "update" if name.startswith("update") else "rollout"
        per = args.ga_steps if phase == "update" else args.new_tokens
        layer, fixed, syncs = per_layer(small[phase], large[phase], DEPTHS, per)
        print(f"{name:36s}{layer:11.1f}{fixed:9.1f}{syncs:8.2f}", flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
