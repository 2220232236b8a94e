"""TRL's lr_scheduler_type and lr_scheduler_kwargs on lmrl: the schedule a TRL config describes is the
one transformers' get_scheduler builds from the same arguments, step for step; what lmrl's schedules
cannot follow is refused with the argument named."""

from __future__ import annotations

import pytest
import torch

from lmrl.common.schedules import make_scheduler
from lmrl.config import ConfigError
from lmrl.trl import GRPOConfig, SFTConfig

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning",  # transformers' gradient_checkpointing rename
                                        "ignore:Both num_training_steps and num_stable_steps:UserWarning")
STEPS = 40


def lrs(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def optimizer(lr):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


@pytest.mark.parametrize("kind", [SFTConfig, GRPOConfig])
@pytest.mark.parametrize("name, kwargs, warmup", [
    ("cosine_with_min_lr", {"min_lr_rate": 0.1}, 0.1),
    ("cosine_with_min_lr", {"min_lr": 2e-6}, 4),
    ("cosine", {"num_cycles": 0.5}, 0),
    ("warmup_stable_decay", {"num_decay_steps": 10}, 5),
    ("warmup_stable_decay", {"num_decay_steps": 8, "decay_type": "1-sqrt", "min_lr_ratio": 0.2}, 0.1),
    ("warmup_stable_decay", {"num_decay_steps": 8, "num_stable_steps": 28, "decay_type": "linear"}, 4),
])
def test_a_trl_schedule_is_transformers_schedule_step_by_step(kind, name, kwargs, warmup, tmp_path):
    from transformers import get_scheduler

    args = kind(output_dir=str(tmp_path), learning_rate=1e-5, max_steps=STEPS, lr_scheduler_type=name,
                lr_scheduler_kwargs=kwargs, warmup_steps=warmup, per_device_train_batch_size=8)
    s = args.to_config(model_path="m", train_rows=8).schedule
    ours_opt, theirs_opt = optimizer(1e-5), optimizer(1e-5)
    ours = make_scheduler(ours_opt, total_steps=STEPS, name=s.name, warmup_steps=s.warmup_steps,
                          min_lr_ratio=s.min_lr_ratio, decay_steps=s.decay_steps, decay_shape=s.decay_shape)
    theirs = get_scheduler(args.lr_scheduler_type, theirs_opt, num_warmup_steps=args.get_warmup_steps(STEPS),
                           num_training_steps=STEPS, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    assert lrs(ours, ours_opt, STEPS + 1) == pytest.approx(lrs(theirs, theirs_opt, STEPS + 1), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("name, kwargs, message", [
    ("cosine_with_min_lr", {}, "give one of min_lr and min_lr_rate"),
    ("cosine_with_min_lr", {"min_lr": 1e-6, "min_lr_rate": 0.1}, "give one of min_lr and min_lr_rate"),
    ("cosine", {"num_cycles": 2}, r"num_cycles=0.5"),
    ("linear", {"power": 2}, "power is not an argument lmrl's linear schedule takes"),
    ("warmup_stable_decay", {}, "num_decay_steps is required"),
    ("warmup_stable_decay", {"num_decay_steps": 5, "warmup_type": "cosine"}, "warmup_type='linear'"),
    ("warmup_stable_decay", {"num_decay_steps": 5, "num_stable_steps": 5}, "make warm-up \\+ stable \\+ decay equal"),
    ("warmup_stable_decay", {"num_decay_steps": 5, "decay_type": "exp"}, "schedule.decay_shape='exp' is not one of"),
])
def test_schedule_arguments_lmrl_cannot_follow_are_refused_with_the_argument(name, kwargs, message, tmp_path):
    args = SFTConfig(output_dir=str(tmp_path), max_steps=STEPS, lr_scheduler_type=name, lr_scheduler_kwargs=kwargs)
    with pytest.raises(ConfigError, match=message):
        args.to_config(model_path="m", train_rows=8)
