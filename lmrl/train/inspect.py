"""Loading a finished (or running) run back for `lmrl eval` and `lmrl generate`: a checkpoint's weights,
or the weight average it holds when the run evaluated one (`train.ema_decay`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common.chat import hold_template_kwargs
from ..common.errors import ConfigError
from ..config import Config, load_config
from ..models import build_model
from ..generation.rollout import sample, sample_text
from ..tasks.math_reward import parse_completion
from ..tasks import build_task
from ..tasks.rewards import build_reward
from .. import checkpoint as ckpt
from .evaluate import evaluate
from .weight_average import FILE as AVERAGE_FILE, load_average


class PromptError(ValueError):
    """A prompt the run's task cannot read."""


def resolve_checkpoint(run_dir: Path, which: str) -> Path:
    """'latest', 'best', 'step_N' (inside run_dir/checkpoints) or a path to a checkpoint dir."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if which == "latest":
        path = ckpt.latest_checkpoint(ckpt_dir)
        if path is None:
            raise FileNotFoundError(f"no checkpoint in {ckpt_dir}")
        return path
    path = ckpt_dir / which if (ckpt_dir / which).exists() else Path(which)
    if not ckpt.weights_file(path).exists():  # model.safetensors, or a LoRA adapter's adapter_model.safetensors
        raise FileNotFoundError(f"checkpoint {which!r} not found (looked for {path / ckpt.MODEL_FILE} or "
                                f"{path / ckpt.ADAPTER_FILE})")
    return path


@dataclass
class LoadedRun:
    config: Config
    checkpoint: Path
    model: torch.nn.Module
    task: object

    def evaluate(self, size: int | None = None) -> dict:
        """Held-out metrics of the first `size` held-out problems (None: eval.size)."""
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError(f"size (held-out problems to evaluate) must be at least 1, got {size}")
        if getattr(self.task, "reward", True) is None:  # open prompts scored by the run's reward functions
            _score_with_run_rewards(self.task, self.config)
        ids = self.task.heldout_ids[: self.config.eval.size if size is None else size]
        metrics = evaluate(self.model, self.task, ids, batch_size=self.config.eval.batch_size)
        return {"checkpoint": str(self.checkpoint), "heldout_problems": len(ids), **metrics}

    def generate(self, prompts: list[str], temperature: float = 0.0):
        """(prompt, completion, answer as read) for each prompt; greedy when temperature is 0."""
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
        if hasattr(self.task, "render_prompt"):  # a text task: its template, the HF model's sampling
            texts = [self.task.render_prompt(p) for p in prompts]
            ro = sample_text(self.model, texts, self.task.max_new_tokens, greedy=temperature == 0,
                             temperature=temperature or 1.0)
            for p, c in zip(prompts, self.task.completion_texts(ro)):
                yield p, c, parse_completion(c)[1]
            return
        tok = self.task.tokenizer
        example = self.task.prompt_text(123 % 10**self.task.ndigit, 45)
        for p in prompts:
            unknown = next((c for c in p if c not in tok.stoi), None)
            if unknown is not None:
                raise PromptError(f"character {unknown!r} in prompt {p!r} is not in the model's alphabet "
                                  f"{tok.chars!r}; prompts must look like {example!r}")
        ids = [tok.encode(p) for p in prompts]
        if len({len(i) for i in ids}) != 1 or len(ids[0]) != self.task.prompt_len:
            raise PromptError(f"prompts must look like {example!r} ({self.task.prompt_len} characters each)")
        ro = sample(self.model, torch.tensor(ids), self.task.answer_len, greedy=temperature == 0,
                    temperature=temperature or 1.0)
        for p, c in zip(prompts, ro.completions):
            text = tok.decode(c)
            yield p, text, self.task.decode_answer(text).lstrip("0") or "0"


def load_run(run_dir: Path, which: str = "latest") -> LoadedRun:
    return LoadedRun(*_load(run_dir, which, with_task=True))


def load_run_model(run_dir: Path, which: str = "latest") -> tuple[Config, Path, torch.nn.Module]:
    """(config, checkpoint dir, model with that checkpoint's weights, in eval mode) of a run. An hf
    run's own task (and its data files) is not built."""
    cfg, path, model, _ = _load(run_dir, which, with_task=False)
    return cfg, path, model


def _load(run_dir: Path, which: str, with_task: bool) -> tuple:
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir} is not a run dir (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml", saved_run=True)
    if cfg.model.type == "hf":  # the base model from model.path, then the checkpoint's weights (or adapter)
        model = build_model(cfg.model, lora=cfg.lora)
        hold_template_kwargs(model.tokenizer, cfg.model.chat_template_kwargs)  # rendered as in training
        task = build_task(cfg, tokenizer=model.tokenizer) if with_task else None
    else:  # the GPT's vocabulary is its task's
        task = build_task(cfg)
        model = build_model(cfg.model, task.tokenizer.vocab_size)
    path = resolve_checkpoint(run_dir, which)
    ckpt.load_checkpoint(path, model=model, restore_rng=False)
    average = path / AVERAGE_FILE
    if average.is_file():  # a run with train.ema_decay evaluated this average, not the trained weights
        load_average(model, average)
    model.eval()
    return cfg, path, model, task


def _score_with_run_rewards(task, cfg: Config) -> None:
    """Gives a task that training scored with its reward functions (open prompts) the functions of
    the run's `reward` section, or refuses in one line when they were passed from Python."""
    reward = build_reward(cfg.reward)
    if reward is None:
        raise ConfigError(f"{cfg.run.dir}: its prompts were scored by reward functions passed from Python, which its "
                          f"config.yaml does not name; to evaluate it, set reward.funcs there (package.module:function "
                          f"or path/to/file.py:function each)")
    task.score_with(reward)


def export_run(run_dir: Path, out_dir: Path | None = None, which: str = "latest") -> Path:
    """Writes a run's model where other tools load it: for an hf model, a plain transformers model
    (any LoRA adapter merged into the weights) that `AutoModelForCausalLM.from_pretrained` loads;
    for the built-in GPT, its own config.json + model.safetensors + tokenizer.json."""
    run = load_run(run_dir, which)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "export"
    out.mkdir(parents=True, exist_ok=True)
    if run.config.model.type == "hf":
        from ..models.lora import export_merged

        return export_merged(run.model, run.model.tokenizer, out)
    run.model.save_pretrained(out, run.task.tokenizer)
    return out
