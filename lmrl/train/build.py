"""A run put together from its config, in one place: the trainer's own copy of the config, the
policy (or reward model) with its tokenizer, and for RL the task. `RLTrainer`, the offline trainers
(SFT, DPO, reward model) and the Ray rollout workers all build through `build_run`, so a worker's
task and policy are the learner's (same seed, same order of random draws) by construction.

    config = own_config(config, "rl")              # a deep copy the trainer may change
    parts = build_run(config, device=device)       # RunParts(model, tokenizer, task)
    functools.partial(build_worker_parts, config)  # what a Ray rollout worker builds its parts with

The KL reference (RL with a KL term, DPO) is `lmrl.models.reference.build_reference`, made from the
policy as training starts."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch

from .. import checkpoint as ckpt
from ..common.chat import hold_template_kwargs
from ..common.errors import ConfigError
from ..config import Config
from ..models import build_model
from ..models.gpt import CharTokenizer
from ..models.reward_model import build_reward_model
from ..tasks import build_task
from ..tasks.protocol import Task
from .offline_setup import data_texts


@dataclass
class RunParts:
    """What a run trains and samples with: `model` (the policy; run.trainer=reward's reward model),
    its `tokenizer`, and RL's `task` (prompts, rollouts, verifier; None for the offline trainers)."""

    model: torch.nn.Module
    tokenizer: object
    task: Task | None = None


def own_config(config: Config, trainer: str) -> Config:
    """A trainer's own deep copy of `config` with `run.trainer` set to `trainer`: a trainer changes
    its copy (run.dir, RL's task and algorithm set from its arguments), never the caller's object."""
    config = copy.deepcopy(config)
    config.run.trainer = trainer
    return config


def build_run(cfg: Config, *, device=None, model=None, task: Task | None = None, env_factory=None) -> RunParts:
    """The parts `cfg.run.trainer` trains with. The seed is set first, so every random
    initialisation (the GPT's, a LoRA adapter's, a reward model's score head) is the seed's:

    rl      an hf policy from `model.path` (+ LoRA), its tokenizer holding model.chat_template_kwargs,
            then the task (with that tokenizer; `env_factory` for task.name=env), else the built-in GPT
            sized to the task's vocabulary; `model.init_from` loaded into the policy. A `model` or `task`
            given is used as it is.
    sft/dpo an hf policy, else the GPT with a character tokenizer over the characters of
            data.train_file and data.eval_file.
    reward  a reward model: a one-number head on `model.path`'s trunk (+ LoRA).

    `device`: where the model is moved (None: left where it was built)."""
    torch.manual_seed(cfg.run.seed)
    if cfg.run.trainer == "rl":
        if model is None and cfg.model.type == "hf":
            model = build_model(cfg.model, lora=cfg.lora)
        if hasattr(model, "tokenizer"):  # before the task renders its prompts with it
            hold_template_kwargs(model.tokenizer, cfg.model.chat_template_kwargs)
        if task is None:
            task = build_task(cfg, tokenizer=getattr(model, "tokenizer", None), device=device or "cpu",
                              env_factory=env_factory)
        model = model if model is not None else build_model(cfg.model, task.tokenizer.vocab_size)
        model = model.to(device) if device is not None else model
        if cfg.model.init_from:
            ckpt.load_initial_weights(model, cfg.model.init_from, device or "cpu")
        return RunParts(model, getattr(task, "tokenizer", None), task)
    if cfg.run.trainer == "reward":
        m = cfg.model
        model, tokenizer = build_reward_model(m.path, gguf_file=m.gguf_file, dtype=m.dtype, lora=cfg.lora)
    elif cfg.model.type == "hf":
        model = build_model(cfg.model, lora=cfg.lora)
        tokenizer = model.tokenizer
    else:
        chars = set(data_texts(cfg.data.train_file) + data_texts(cfg.data.eval_file))
        tokenizer = CharTokenizer("".join(sorted(chars)) or " ")
        if cfg.model.n_position < cfg.data.max_length:
            raise ConfigError(f"data.max_length={cfg.data.max_length} is longer than model.n_position="
                              f"{cfg.model.n_position}; raise model.n_position or lower data.max_length")
        model = build_model(cfg.model, tokenizer.vocab_size)
    return RunParts(model.to(device) if device is not None else model, tokenizer)


class NoScore:
    """The reward a rollout worker's prompts task gets: workers never score, so no reward model is loaded."""

    def __call__(self, prompts, completions, **columns):
        raise RuntimeError("rollout workers do not score completions; the learner does")


def build_worker_parts(cfg: Config, device) -> RunParts:
    """A Ray rollout worker's task and policy on `device`: `build_run(cfg)` as the learner ran it
    (so a LoRA adapter's frozen base and the GPT's initial weights are the learner's), except that
    the task never scores (`NoScore`: a reward model is not loaded). `RLTrainer` hands
    `functools.partial(build_worker_parts, config)` to the Ray engine (`make_engine(build_worker=)`)."""
    unscored = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, model="", cls=f"{__name__}:NoScore"))
    return build_run(unscored, device=device)
