"""The RL trainer's supervised warm-up: cross-entropy on the answers of a budget of labeled problems.

`task.labeled(ids)` is the only place in a run where labels are read (RL sees rewards alone); the
ids are the `sft.examples` distinct training problems the trainer drew once from the seed. The
stage shares the trainer's step counter, logging, evaluation and checkpoints (see loop.py).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


def run_sft_stage(trainer) -> None:
    """Runs warm-up steps until `sft.steps`, then hands over to RL with a checkpoint at the boundary."""
    cfg, task, state = trainer.config, trainer.task, trainer.state
    rows = task.labeled(trainer.sft_pool)
    trainer._make_optimizer(cfg.sft.lr, cfg.sft.weight_decay, cfg.sft.steps, "cosine", cfg.sft.warmup_steps)
    trainer._restore_pending()
    batch = cfg.sft.batch_size // trainer.dist.world_size
    n = task.answer_len
    while state["step"] < cfg.sft.steps and not trainer._stop_requested:
        t0 = time.perf_counter()
        idx = torch.randint(len(rows), (batch,), generator=trainer.generators["data"])
        x = rows[idx].to(trainer.device)
        logits = trainer.train_model(x[:, :-1])[:, -n:]  # (B, N, V): answer positions only
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), x[:, -n:].reshape(-1))
        loss.backward()
        lr = trainer.optimizer.param_groups[0]["lr"]
        metrics = {f"sft/{k}": v for k, v in trainer.optimizer_step(loss.detach()).items()}
        trainer.scheduler.step()
        metrics.update({"sft/lr": lr, "sft/accuracy": (logits.argmax(-1) == x[:, -n:]).all(-1).float().mean().item()})
        trainer._end_step("sft", metrics, time.perf_counter() - t0, tokens=x.numel())
    if state["step"] >= cfg.sft.steps and not trainer._stop_requested:
        state["stage"] = "rl"
        trainer._info(f"warm-up done: held-out accuracy {state['warmup_accuracy']:.3f} from "
                      f"{len(trainer.sft_pool)} labeled problems")
        trainer.optimizer = None
        trainer._save_checkpoint()
