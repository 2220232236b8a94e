"""The run directory and everything a run writes to it besides checkpoints: train.log,
metrics.jsonl, TensorBoard events, Weights & Biases, and the console progress bar."""

from __future__ import annotations

from pathlib import Path

from ..config import Config, ConfigError, config_to_dict
from ..log.sinks import (ConsoleSink, JsonlSink, MetricsLogger, TensorBoardSink, WandbSink, progress, setup_logging,
                         truncate_jsonl)


def prepare_run_dir(cfg: Config) -> Path:
    """Creates and returns the run dir, failing early with one line if it cannot be written.

    A fresh run (run.resume=never) never writes into a directory that already holds a run: with
    the default `runs/<name>` it moves on to `runs/<name>-2`, `-3`, ...; with an explicit run.dir
    it stops and says what to do, so nothing already saved is overwritten."""
    path = Path(cfg.run_dir)
    if cfg.run.resume != "auto" and holds_a_run(path):
        if cfg.run.dir is not None:
            raise ConfigError(f"run.dir {path} already holds a run; continue it with --resume (run.resume=auto) "
                              f"or choose another run.dir")
        n = 2
        while holds_a_run(path.with_name(f"{path.name}-{n}")):
            n += 1
        path = path.with_name(f"{path.name}-{n}")
        cfg.run.dir = str(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run dir {path} is not writable: {e.strerror or e}") from None
    return path


def holds_a_run(path: Path) -> bool:
    return (path / "metrics.jsonl").exists() or (path / "checkpoints").exists()


class RunLog:
    """Rank 0's logging: console + train.log, metrics.jsonl, TensorBoard, optional wandb, and a
    progress bar over all steps. `resume_step` is the step of the checkpoint the run resumed from,
    None when it loaded none. Metrics an earlier attempt logged after that step (all of them when
    None) are dropped first, so the files read as if the run had never stopped."""

    def __init__(self, run_dir: Path, cfg: Config, *, total_steps: int, resume_step: int | None = None):
        self.logger = setup_logging(run_dir)
        metrics_path = run_dir / "metrics.jsonl"
        if metrics_path.exists():
            truncate_jsonl(metrics_path, resume_step)
        sinks = [ConsoleSink(self.logger, total_steps), JsonlSink(metrics_path)]
        if cfg.run.tensorboard:
            # TensorBoard hides the events an earlier attempt wrote from purge_step on: all of them
            # when the run starts again from step 0
            if resume_step is not None:
                purge = resume_step + 1
            else:
                purge = 0 if (run_dir / "tb").exists() else None
            sinks.append(TensorBoardSink(run_dir / "tb", purge_step=purge))
        if cfg.run.wandb:
            sinks.append(WandbSink(cfg.run.wandb_project, cfg.run.name, config_to_dict(cfg), run_dir,
                                   mode=cfg.run.wandb_mode))
        self.metrics = MetricsLogger(sinks)
        self.bar = progress(total_steps, initial=resume_step or 0, desc=cfg.run.name, enabled=cfg.run.progress)

    def log(self, step: int, metrics: dict, **context) -> None:
        self.metrics.log(step, metrics, **context)

    def info(self, msg: str) -> None:
        self.logger.info(msg)

    def warning(self, msg: str) -> None:
        self.logger.warning(msg)

    def advance(self, step: int) -> None:
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()
        self.metrics.close()
