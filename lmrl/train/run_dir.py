"""The run directory and everything a run writes to it besides checkpoints: train.log,
metrics.jsonl, completions.jsonl, TensorBoard events, Weights & Biases, and the console progress bar.

One run dir, one run: preparing a run dir takes its lock (`flock` on `<run dir>/.lock`, which
holds the owner's pid), fresh and resumed runs alike, so a second process on the same dir stops
with one line instead of writing beside the first. The lock is the process's until the run ends
(`unlock_run_dir`) or the process exits, whichever comes first: a killed run leaves none."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..config import Config, ConfigError, config_to_dict
from ..log.completions import COMPLETIONS_FILE, CompletionsLog
from ..log.sinks import (ConsoleSink, JsonlSink, MetricsLogger, TensorBoardSink, WandbSink, progress, setup_logging,
                         truncate_jsonl)


LOCK_FILE = ".lock"
_locks: dict[Path, list] = {}  # run dir (resolved) -> [its open lock file, holders in this process]


class RunDirInUse(ConfigError):
    """Another process holds the run dir's lock."""


def prepare_run_dir(cfg: Config) -> Path:
    """Creates, locks (see the module docstring) and returns the run dir, failing early with one
    line if it cannot be written or another process holds it.

    A fresh run (run.resume=never) never writes into a directory that already holds a run, or that
    another run holds: with the default `runs/<name>` it moves on to `runs/<name>-2`, `-3`, ...;
    with an explicit run.dir it stops and says what to do, so nothing already saved is overwritten."""
    base, fresh, explicit = Path(cfg.run_dir), cfg.run.resume != "auto", cfg.run.dir is not None
    n = 1
    while True:
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        n += 1
        if fresh and holds_a_run(path):
            if explicit:
                raise ConfigError(f"run.dir {path} already holds a run; continue it with --resume (run.resume=auto) "
                                  f"or choose another run.dir")
            continue
        _writable(path)
        try:
            lock_run_dir(path)
        except RunDirInUse:
            if fresh and not explicit:
                continue
            raise
        break
    if path != base:
        cfg.run.dir = str(path)
    return path


def _writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run dir {path} is not writable: {e.strerror or e}") from None


def lock_run_dir(path: Path) -> None:
    """Take `path`'s lock for this process (again, if it holds it already: each take needs its
    `unlock_run_dir`); raises RunDirInUse, naming the holder's pid, when another process holds it."""
    key = Path(path).resolve()
    if key in _locks:
        _locks[key][1] += 1
        return
    file = open(key / LOCK_FILE, "a+")
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        file.seek(0)
        owner = file.read().strip() or "unknown"
        file.close()
        raise RunDirInUse(f"run dir {path} is in use by another lmrl run (pid {owner}); wait for it to end or choose "
                          f"another run.dir") from None
    file.seek(0)
    file.truncate()
    file.write(f"{os.getpid()}\n")
    file.flush()
    _locks[key] = [file, 1]


def unlock_run_dir(path: Path) -> None:
    """Give back one take of `path`'s lock (`lock_run_dir`); nothing when this process holds none."""
    key = Path(path).resolve()
    entry = _locks.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _locks[key]
        entry[0].close()


def holds_a_run(path: Path) -> bool:
    return (path / "metrics.jsonl").exists() or (path / "checkpoints").exists()


class RunLog:
    """Rank 0's logging: console + train.log, metrics.jsonl, TensorBoard, optional wandb, the
    completions log (train.log_completions) and a progress bar over all steps. `resume_step` is the
    step of the checkpoint the run resumed from, None when it loaded none. Metrics and completions an
    earlier attempt logged after that step (all of them when None) are dropped first, so the files
    read as if the run had never stopped."""

    def __init__(self, run_dir: Path, cfg: Config, *, total_steps: int, resume_step: int | None = None):
        self.logger = setup_logging(run_dir)
        metrics_path, completions_path = run_dir / "metrics.jsonl", run_dir / COMPLETIONS_FILE
        for path in (metrics_path, completions_path):
            if path.exists():
                truncate_jsonl(path, resume_step)
        sinks = [ConsoleSink(self.logger, total_steps), JsonlSink(metrics_path)]
        if cfg.run.tensorboard:
            # TensorBoard hides the events an earlier attempt wrote from purge_step on: all of them
            # when the run starts again from step 0
            if resume_step is not None:
                purge = resume_step + 1
            else:
                purge = 0 if (run_dir / "tb").exists() else None
            sinks.append(TensorBoardSink(run_dir / "tb", purge_step=purge))
        wandb = None
        if cfg.run.wandb:
            wandb = WandbSink(cfg.run.wandb_project, cfg.run.name, config_to_dict(cfg), run_dir,
                              mode=cfg.run.wandb_mode)
            sinks.append(wandb)
        self.metrics = MetricsLogger(sinks)
        self.completions = None
        if cfg.train.log_completions:
            self.completions = CompletionsLog(completions_path, self.logger, to_print=cfg.train.completions_to_print,
                                              wandb=wandb)
        self.bar = progress(total_steps, initial=resume_step or 0, desc=cfg.run.name, enabled=cfg.run.progress)

    def log(self, step: int, metrics: dict, **context) -> None:
        self.metrics.log(step, metrics, **context)

    def log_completions(self, step: int, rows: list[dict], *, title: str = "") -> None:
        """A step's completions (`lmrl.log.completions`), with train.log_completions on; `title` heads
        the printed ones."""
        self.completions.log(step, rows, title=title)

    def info(self, msg: str) -> None:
        self.logger.info(msg)

    def warning(self, msg: str) -> None:
        self.logger.warning(msg)

    def advance(self, step: int) -> None:
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()
        if self.completions is not None:
            self.completions.close()
        self.metrics.close()
