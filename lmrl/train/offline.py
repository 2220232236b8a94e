"""The offline trainers' common part (SFT, DPO, reward model): epochs over a JSONL data set, on the
shared run lifecycle (`lifecycle.Trainer`: optimizer and schedule, accumulation, evaluation, best
model, early stopping, checkpoints, exact resume, export, summary.json).

    trainer = DPOTrainer(load_config("dpo-smollm2"))
    summary = trainer.train()    # {"best": {...}, "final": {...}, "steps_done": ..., "time_s": ...}

Rows come from `data.train_file` / `data.eval_file`, or from `train_dataset=` / `eval_dataset=`
handed to the constructor (a `datasets.Dataset`, a list of dicts), in TRL's formats (see
`lmrl.tasks.preference_data`); `eval_dataset={"a": rows, "b": rows}` holds several held-out sets, each
evaluated on its own and reported as eval/<set>_<metric> (transformers' names for several sets), the
default best metric being the first set's. The model is `build_run`'s for the trainer's run.trainer (see
`lmrl.train.build`), unless one is handed in; a subclass says what a row and its loss are:
`read(source) -> rows` (checked before any model loads),
`encoder(rows, codec, max_length, counter) -> examples` (token ids and loss masks),
`collate(examples) -> batch`, `compute_loss(batch) -> (loss, metrics)` and `row_tokens(example)`.
A metric is averaged over a step's micro-batches, or over the held-out rows, weighted by rows; a
`TokenMean` is a mean over all their tokens. `num_tokens` (TRL's) counts the training tokens so far,
every rank's, as TRL's collators lay them out.

The data order is a pure function of (seed, epoch): step k reads rows k·B .. (k+1)·B − 1 of the
stream of per-epoch permutations, so a resumed run reads exactly the rows it would have read, and
nothing about the order has to be saved."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..config import Config
from ..config.schema import batch_split_problem
from ..common.chat import hold_template_kwargs
from ..common.errors import ConfigError
from ..tasks.preference_data import Columns, TruncationCounter, read_preference
from ..tasks.registry import ensure_data
from ..tasks.text_batches import (PairExample, TextCodec, encode_preferences, pair_batch, pair_length, pair_rows,
                                  takes_pair_rows)
from .build import build_run, own_config
from .lifecycle import Stage, Trainer


@dataclass(frozen=True)
class TokenMean:
    """A metric that is a mean over tokens, as `compute_loss` returns it: its sum and its count, which
    the trainer adds up over a step's micro-batches (or the held-out batches) before dividing, so
    the value is the mean over all their tokens whichever rows share a micro-batch (TRL's token-weighted
    means). Over no tokens it is 0, as TRL logs it."""
    total: float
    count: float

    def __add__(self, other: TokenMean) -> TokenMean:
        return TokenMean(self.total + other.total, self.count + other.count)

    @property
    def value(self) -> float:
        return self.total / self.count if self.count else 0.0


@dataclass(frozen=True)
class Extreme:
    """A metric that is the smallest (or, `largest`, the largest) value over a step's micro-batches (or
    the held-out batches), whichever rows share a micro-batch. TRL's reward trainer averages each
    micro-batch's minimum and maximum instead: the same with one micro-batch."""
    value: float
    largest: bool = False

    def __add__(self, other: Extreme) -> Extreme:
        return Extreme((max if self.largest else min)(self.value, other.value), self.largest)


def add_metrics(sums: dict, metrics: dict, weight: float) -> None:
    """Adds one batch's `metrics` into `sums`: a number times `weight` (the batch's share of the rows),
    a `TokenMean` or an `Extreme` as it is."""
    for key, v in metrics.items():
        if isinstance(v, (TokenMean, Extreme)):
            sums[key] = sums[key] + v if key in sums else v
        else:
            sums[key] = sums.get(key, 0.0) + v * weight


def metric_values(sums: dict) -> dict:
    """`add_metrics`' sums as numbers: a `TokenMean` divided by its tokens, an `Extreme`'s value."""
    return {key: v.value if isinstance(v, (TokenMean, Extreme)) else v for key, v in sums.items()}


class OfflineTrainer(Trainer):
    """Subclasses set `name` (the metrics' prefix: sft, dpo, rm), `trainer_key` (its run.trainer
    value), `accuracy_key` (the training metric that evaluation also reports as eval/accuracy),
    and implement `read`, `encoder`, `collate` and `compute_loss`. Each works on its own copy of the
    config it is given (`own_config`)."""

    trainer_key = "sft"
    accuracy_key: str | None = None

    def __init__(self, config: Config, *, model=None, tokenizer=None, train_dataset=None, eval_dataset=None,
                 callbacks=None):
        super().__init__(own_config(config, self.trainer_key), callbacks=callbacks)  # the caller's is not changed
        cfg = self.config
        if train_dataset is None and cfg.data.train_file:
            ensure_data(cfg, "data")
        split = batch_split_problem(cfg, self.dist.world_size)
        if split is not None:
            raise ConfigError(split)
        train = train_dataset if train_dataset is not None else cfg.data.train_file
        if train is None:
            raise ConfigError(f"run.trainer={self.trainer_key} reads data.train_file (JSONL or parquet): set it (data.generate="
                              f"preferences writes synthetic pairs offline), or pass train_dataset=")
        held_out = eval_dataset if eval_dataset is not None else cfg.data.eval_file
        # the held-out sets by name: {name: rows} as transformers takes several, or one set named ""
        sources = dict(held_out) if isinstance(held_out, dict) else {} if held_out is None else {"": held_out}
        # every row is read and checked before a model loads: a bad row costs no model load
        train_rows = self.read(train)
        eval_rows = {name: self.read(source) for name, source in sources.items()}
        if not train_rows:
            raise ValueError(f"{source_name(train)} holds no rows")
        empty = [name for name, rows in eval_rows.items() if name and not rows]
        if empty:
            raise ValueError(f"eval_dataset[{empty[0]!r}] holds no rows")
        if any(sources):
            self.best_metric = held_out_best_metric(cfg.train.best_metric, self.best_metric, list(sources))
        if model is None:
            model, tokenizer = self.build_model()
        tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(f"{type(self).__name__}(model=...) needs its tokenizer: pass tokenizer=...")
        self.model, self.tokenizer = model.to(self.device), tokenizer
        hold_template_kwargs(tokenizer, cfg.model.chat_template_kwargs)
        self.codec = TextCodec(tokenizer, chat=cfg.data.chat)
        self.pad_id = getattr(tokenizer, "pad_token_id", None) or 0
        self.train_rows = self.encode(train_rows, source_name(train))
        self.eval_sets = {name: self.encode(rows, source_name(sources[name]) + (f" ({name})" if name else ""))
                          [: cfg.data.eval_size or None] for name, rows in eval_rows.items() if rows}
        self.init_state()

    # -- what a subclass provides ------------------------------------------------------------------
    def build_model(self) -> tuple[torch.nn.Module, object]:
        """(model, tokenizer) from the config (`build_run`: an hf policy, the GPT over the data's
        characters, or run.trainer=reward's reward model), on the CPU."""
        parts = build_run(self.config)
        return parts.model, parts.tokenizer

    def fresh_model(self) -> torch.nn.Module:
        return self.build_model()[0]

    def read(self, source) -> list:
        """The rows of `source` (a JSONL path, .jsonl / .jsonl.gz, or rows handed in: a datasets.Dataset,
        a list of dicts), each checked, in any of the formats `lmrl.tasks.preference_data` reads."""
        raise NotImplementedError

    # (rows, codec, max_length, counter) -> examples: token ids and loss masks, every cut counted
    encoder: Callable[..., list]

    def encode(self, rows: list, name: str) -> list:
        """`read`'s rows as token ids and loss masks (truncation counted in `self.data_notes` under `name`)."""
        counter = TruncationCounter()
        examples = self.encoder(rows, self.codec, self.config.data.max_length, counter)
        self.data_notes.append(f"{name}: {counter}")
        return examples

    def collate(self, rows: list):
        raise NotImplementedError

    def compute_loss(self, batch) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def row_tokens(self, row) -> int:
        """The tokens TRL's collator puts in the attention mask for this row (what `num_tokens` counts)."""
        raise NotImplementedError

    def trainable_module(self) -> torch.nn.Module:
        return self.model

    def _call(self) -> torch.nn.Module:
        """What runs the trained model's forward: its DDP wrapper while training, else the model."""
        return self.train_model if self.model.training and self.train_model is not None else self.model

    # -- the loop ----------------------------------------------------------------------------------
    def stages(self) -> list[Stage]:
        cfg = self.config
        steps = cfg.train.max_steps or max(1, math.ceil(cfg.data.epochs * len(self.train_rows) / cfg.data.batch_size))
        return [Stage(self.name, steps, eval_every=cfg.train.eval_every, clock="train")]

    def run_stage(self, stage: Stage) -> None:
        cfg = self.config
        self.make_optimizer(self.trainable_module(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                            steps=stage.steps, schedule=cfg.schedule.name, warmup_steps=cfg.schedule.warmup_steps,
                            betas=cfg.optim.betas, eps=cfg.optim.eps, ema_decay=cfg.train.ema_decay)
        self.step_until_done(stage, self.train_step)

    @property
    def eval_rows(self) -> list:
        """Every held-out set's encoded rows, in order."""
        return [row for rows in self.eval_sets.values() for row in rows]

    def describe_data(self) -> str:
        return f"{len(self.train_rows)} training rows, {len(self.eval_rows)} held-out"

    def batch_rows(self, step: int) -> list:
        """This rank's rows of optimizer step `step` (0-based): a contiguous slice of the global batch."""
        cfg, n = self.config, len(self.train_rows)
        size = cfg.data.batch_size
        per_rank = size // self.dist.world_size
        start = step * size + self.dist.rank * per_rank
        rows, perms = [], {}
        for i in range(start, start + per_rank):
            epoch, offset = divmod(i, n)
            if epoch not in perms:
                perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + epoch))
            rows.append(self.train_rows[perms[epoch][offset].item()])
        return rows

    def ordered(self, rows: list) -> list:
        """The order in which `rows` are cut into micro-batches: as given (SFT's loss is a token mean per
        micro-batch, so which rows share one changes it; a pair trainer's mean over pairs does not)."""
        return rows

    def accumulate(self, rows: list) -> tuple[torch.Tensor, dict]:
        """Forward and backward of one optimizer step's `rows` in `train.ga_steps` micro-batches, each
        weighted by its share of the rows: (the step's loss, its metrics; a `TokenMean` over all the
        step's tokens)."""
        rows = self.ordered(rows)
        micro = max(1, math.ceil(len(rows) / self.config.train.ga_steps))
        chunks = [rows[i:i + micro] for i in range(0, len(rows), micro)]
        total, sums = torch.zeros((), device=self.device), {}
        for k, chunk in enumerate(chunks):
            with self.no_sync(k == len(chunks) - 1):  # DDP all-reduces gradients on the last micro-batch only
                loss, metrics = self.compute_loss(self.collate(chunk))
                (loss * len(chunk) / len(rows)).backward()
            total += loss.detach() * len(chunk) / len(rows)
            add_metrics(sums, metrics, len(chunk) / len(rows))
        return total, metric_values(sums)

    def train_step(self, stage: Stage) -> None:
        """One optimizer step over `train.ga_steps` micro-batches (`accumulate`)."""
        t0 = time.perf_counter()
        self.model.train()
        rows = self.batch_rows(self.state["step"])
        total, sums = self.accumulate(rows)
        lr = self.optimizer.param_groups[0]["lr"]
        stats = self.optimizer_step(total)
        stats.pop("loss")  # the subclass's metrics carry its loss under its own name
        sums.update({f"{self.name}/{k}": v for k, v in stats.items()})
        self.scheduler.step()
        sums[f"{self.name}/lr"] = lr
        # TRL's names (its Trainer logs them for every trainer) beside lmrl's
        sums.update({"loss": total.item(), "grad_norm": stats["grad_norm"], "learning_rate": lr,
                     "num_tokens": self.count_tokens(rows)})
        self.end_step(stage, sums, time.perf_counter() - t0)

    def count_tokens(self, rows: list) -> int:
        """The training tokens so far, with this step's `rows` of every rank (kept in the state, so a
        resume continues the count)."""
        step = self.all_reduce_sum(torch.tensor([sum(map(self.row_tokens, rows))], device=self.device))
        self.state["num_input_tokens_seen"] = self.state.get("num_input_tokens_seen", 0) + int(step.item())
        return self.state["num_input_tokens_seen"]

    # -- evaluation and the end --------------------------------------------------------------------
    @property
    def can_evaluate(self) -> bool:
        """Whether the run evaluates by itself (`evaluate()` runs whenever asked, given held-out rows)."""
        return bool(self.eval_sets) and self.config.train.evaluate

    @torch.no_grad()
    def evaluate(self) -> dict:
        """The training metrics averaged over the held-out rows (weighted by rows; a `TokenMean` over
        their tokens), as eval/<name>, plus eval/accuracy from `accuracy_key` and, as TRL logs it,
        eval/num_tokens: the training tokens so far. Several named held-out sets (eval_dataset=
        {"a": rows, ...}) are evaluated one by one, each set's metrics as eval/<set>_<name>
        (transformers' eval_<set>_<name>)."""
        if not self.eval_sets:
            raise ValueError(f"{type(self).__name__}.evaluate() needs held-out rows: pass eval_dataset= (or set "
                             f"data.eval_file)")
        out = {}
        for name, rows in self.eval_sets.items():
            prefix = f"eval/{name}_" if name else "eval/"
            out.update({prefix + key.removeprefix("eval/"): v for key, v in self.evaluate_rows(rows).items()})
        return out

    def evaluate_rows(self, rows: list) -> dict:
        """`evaluate`'s metrics over one held-out set's `rows`."""
        self.model.eval()
        size = max(1, self.config.data.batch_size // self.config.train.ga_steps)
        sums = {}
        rows = self.ordered(rows)
        for i in range(0, len(rows), size):
            chunk = rows[i:i + size]
            loss, metrics = self.compute_loss(self.collate(chunk))
            add_metrics(sums, {**metrics, f"{self.name}/loss": loss.item()}, len(chunk) / len(rows))
        means = metric_values(sums)
        out = {"eval/" + key.removeprefix(f"{self.name}/"): v for key, v in means.items()}
        if self.accuracy_key is not None:
            out["eval/accuracy"] = means[self.accuracy_key]
        out["eval/num_tokens"] = self.state.get("num_input_tokens_seen", 0)
        return out

    def summary(self) -> dict:
        times = self.state["time"]
        return {
            "trainer": self.name,
            "train_rows": len(self.train_rows), "eval_rows": len(self.eval_rows),
            "steps_done": self.state["step"], "steps_planned": self.total_steps,
            "best_metric": self.best_metric, "best": self.state["best"],
            "final": {k: v for k, v in self.state.get("last_eval", {}).items()},
            "exported_step": self.state.get("exported_step"),
            "time_s": {k: round(v, 2) for k, v in times.items()},
        }


class PairTrainer(OfflineTrainer):
    """An offline trainer over preference pairs {prompt|messages, chosen, rejected} (DPO, reward
    models): rows encoded once with `self.codec`. A batch is one row per pair with its prompt run
    once (`pair_rows`) where every model it runs takes that layout (`scorers`), else each side a
    row of its own (`pair_batch`). A step's rows are cut into micro-batches in order of length,
    so rows of similar lengths are padded together; the loss, a mean over pairs weighted by each
    micro-batch's share of them, is the same whichever pairs share a micro-batch."""

    encoder = staticmethod(encode_preferences)
    share_prompts = True   # False: the plain layout (`pair_batch`) whatever the models take
    sort_by_length = True  # False: micro-batches in data order

    def read(self, source) -> list:
        d = self.config.data
        return read_preference(source, dialogue="auto" if d.chat else "text", columns=Columns.of(d))

    def scorers(self) -> list:
        """The models a batch runs through."""
        return [self.model]

    def uses_pair_rows(self) -> bool:
        return self.share_prompts and all(takes_pair_rows(m) for m in self.scorers())

    @staticmethod
    def pair(row) -> PairExample:
        """A row's pair (a subclass may keep more beside it)."""
        return row

    def row_tokens(self, row) -> int:
        pair = self.pair(row)
        return len(pair.prompt) + pair_length(pair)  # TRL's collators give each side a row with its prompt

    def ordered(self, rows: list) -> list:
        return sorted(rows, key=lambda row: pair_length(self.pair(row))) if self.sort_by_length else rows

    def collate(self, rows):
        pairs = [self.pair(row) for row in rows]
        layout = pair_rows if self.uses_pair_rows() else pair_batch
        return layout(pairs, self.pad_id, self.device)


def held_out_set(metric: str, sets) -> str | None:
    """The held-out set among `sets` (names) whose metric `metric` (eval/<set>_<name>, or TRL's
    eval_<set>_<name>) is: the longest name it starts with; None for none."""
    bare = metric.removeprefix("eval/").removeprefix("eval_")
    return max((name for name in sets if name and bare.startswith(f"{name}_")), key=len, default=None)


def held_out_best_metric(asked: str, default: str, sets: list[str]) -> str:
    """train.best_metric with several named held-out sets: `asked` when it names one of `sets`' metrics,
    else (none asked) `default` on the first set; one that names no set is a ConfigError."""
    if not asked:
        return f"eval/{sets[0]}_{default.removeprefix('eval/')}"
    if held_out_set(asked, sets) is None:
        metric = asked.removeprefix("eval/")
        raise ConfigError(f"train.best_metric={asked!r} names no held-out set: with eval_dataset={{"
                          f"{', '.join(f'{s!r}: ...' for s in sets)}}} each set's metrics are eval/<set>_<metric> "
                          f"(TRL's metric_for_best_model: eval_<set>_<metric>), e.g. eval/{sets[0]}_{metric} "
                          f"(eval_{sets[0]}_{metric})")
    return asked


def source_name(source) -> str:
    """How a data source is named in the log: its path, or "rows handed in"."""
    return str(source) if isinstance(source, (str, os.PathLike)) else "rows handed in"
