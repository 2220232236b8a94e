import io
import math

import pytest
import torch

from lmrl.train.schedule import lr_at, make_scheduler


def test_warmup_rises_linearly_from_one_step_to_base_lr():
    kw = dict(base_lr=1e-3, total_steps=100, warmup_steps=4)
    assert lr_at(0, **kw) == pytest.approx(0.25e-3)
    assert lr_at(1, **kw) == pytest.approx(0.5e-3)
    assert lr_at(3, **kw) == pytest.approx(1e-3)  # last warm-up step reaches base_lr


def test_constant_holds_base_lr_after_warmup():
    kw = dict(base_lr=2e-4, total_steps=10, name="constant", warmup_steps=2)
    assert [lr_at(s, **kw) for s in (2, 5, 9, 50)] == [2e-4] * 4


def test_constant_without_warmup_starts_at_base_lr():
    assert lr_at(0, base_lr=0.1, total_steps=10) == 0.1


def test_cosine_starts_at_base_lr_right_after_warmup():
    assert lr_at(10, base_lr=1.0, total_steps=110, name="cosine", warmup_steps=10) == pytest.approx(1.0)


def test_cosine_midpoint_is_mean_of_base_and_floor():
    # warm-up 10, decay over steps 10..110: halfway is step 60.
    lr = lr_at(60, base_lr=1e-3, total_steps=110, name="cosine", warmup_steps=10, min_lr_ratio=0.2)
    assert lr == pytest.approx((1 + 0.2) / 2 * 1e-3)


def test_cosine_quarter_point_matches_hand_computed_value():
    # p = 1/4: 0.1 + 0.9 * 0.5 * (1 + cos(pi/4)) = 0.1 + 0.45 * 1.70711 = 0.868198
    assert lr_at(25, base_lr=1.0, total_steps=100, name="cosine") == pytest.approx(0.868198, abs=1e-6)


def test_cosine_reaches_floor_at_total_steps_and_holds_it():
    kw = dict(base_lr=1e-3, total_steps=50, name="cosine", warmup_steps=5, min_lr_ratio=0.1)
    assert lr_at(49, **kw) > 1e-4
    assert lr_at(50, **kw) == pytest.approx(1e-4)
    assert lr_at(500, **kw) == pytest.approx(1e-4)


def test_cosine_with_warmup_covering_all_steps_sits_at_floor_afterwards():
    assert lr_at(5, base_lr=1.0, total_steps=5, name="cosine", warmup_steps=5, min_lr_ratio=0.3) == pytest.approx(0.3)


def test_unknown_schedule_name_is_named_in_the_error():
    with pytest.raises(ValueError, match="'linear'"):
        lr_at(0, base_lr=1.0, total_steps=10, name="linear")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="'linear'"):
        make_scheduler(opt, total_steps=10, name="linear")


def test_bad_min_lr_ratio_is_rejected():
    with pytest.raises(ValueError, match="min_lr_ratio"):
        lr_at(0, base_lr=1.0, total_steps=10, name="cosine", min_lr_ratio=1.5)


def make_opt(lr=3e-3):
    return torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=lr)


def train_steps(opt, sched, n):
    """The trainer's order: optimizer step with the current lr, then scheduler step. Returns the lrs used."""
    lrs = []
    for _ in range(n):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


SCHED = dict(total_steps=20, name="cosine", warmup_steps=3, min_lr_ratio=0.1)


def test_scheduler_follows_lr_at_step_by_step():
    opt = make_opt()
    lrs = train_steps(opt, make_scheduler(opt, **SCHED), 25)
    assert lrs == pytest.approx([lr_at(s, base_lr=3e-3, **SCHED) for s in range(25)], rel=1e-12)
    assert lrs[0] == pytest.approx(1e-3) and lrs[2] == pytest.approx(3e-3) and lrs[24] == pytest.approx(3e-4)


def test_scheduler_state_dict_round_trip_resumes_the_same_lrs():
    opt = make_opt()
    sched = make_scheduler(opt, **SCHED)
    straight = train_steps(opt, sched, 20)

    opt = make_opt()
    sched = make_scheduler(opt, **SCHED)
    first = train_steps(opt, sched, 8)
    saved = {"opt": opt.state_dict(), "sched": sched.state_dict()}
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)  # as checkpoint.py loads it

    opt2 = make_opt()
    sched2 = make_scheduler(opt2, **SCHED)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    resumed = first + train_steps(opt2, sched2, 12)
    assert resumed == straight
    assert not math.isclose(resumed[8], resumed[0])  # the resumed part is not the start over again
