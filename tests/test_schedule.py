import io
import math

import pytest
import torch

from lmrl.common.schedules import SCHEDULES, PlateauScheduler, StepScheduler, lr_at, make_scheduler


def test_warmup_rises_linearly_from_zero_to_base_lr_at_step_w():
    kw = dict(base_lr=1e-3, total_steps=100, warmup_steps=4)
    assert lr_at(0, **kw) == 0.0  # as transformers: the first step's lr is 0
    assert lr_at(1, **kw) == pytest.approx(0.25e-3)
    assert lr_at(3, **kw) == pytest.approx(0.75e-3)
    assert lr_at(4, **kw) == pytest.approx(1e-3)  # the first step after warm-up reaches base_lr


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


def test_linear_quarter_point_matches_hand_computed_value():
    # p = 1/4: 1 - (1 - 0.1) * 0.25 = 0.775
    assert lr_at(25, base_lr=1.0, total_steps=100, name="linear") == pytest.approx(0.775)


def test_linear_starts_at_base_lr_after_warmup_and_is_mean_of_base_and_floor_halfway():
    kw = dict(base_lr=1e-3, total_steps=110, name="linear", warmup_steps=10, min_lr_ratio=0.2)
    assert lr_at(0, **kw) == 0.0 and lr_at(1, **kw) == pytest.approx(1e-4)  # warm-up: s/10 of base
    assert lr_at(10, **kw) == pytest.approx(1e-3)
    assert lr_at(60, **kw) == pytest.approx(0.6e-3)
    assert lr_at(85, **kw) == pytest.approx(1e-3 - 0.8e-3 * 0.75)  # p = 3/4: 0.4e-3


def test_linear_reaches_floor_at_total_steps_and_holds_it():
    kw = dict(base_lr=2.0, total_steps=10, name="linear", min_lr_ratio=0.25)
    assert lr_at(9, **kw) == pytest.approx(2.0 - 1.5 * 0.9)
    assert lr_at(10, **kw) == pytest.approx(0.5)
    assert lr_at(1000, **kw) == pytest.approx(0.5)


def test_plateau_has_no_closed_form_and_says_to_use_make_scheduler():
    with pytest.raises(ValueError, match="make_scheduler"):
        lr_at(0, base_lr=1.0, total_steps=10, name="plateau")


def test_unknown_schedule_name_is_named_in_the_error():
    with pytest.raises(ValueError, match="'exponential'"):
        lr_at(0, base_lr=1.0, total_steps=10, name="exponential")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="'exponential'"):
        make_scheduler(opt, total_steps=10, name="exponential")


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
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(1e-3) and lrs[3] == pytest.approx(3e-3)
    assert lrs[24] == pytest.approx(3e-4)


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
    saved = torch.load(buf, weights_only=True)  # as lmrl.checkpoint loads it

    opt2 = make_opt()
    sched2 = make_scheduler(opt2, **SCHED)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    resumed = first + train_steps(opt2, sched2, 12)
    assert resumed == straight
    assert not math.isclose(resumed[8], resumed[0])  # the resumed part is not the start over again


@pytest.mark.parametrize("name", ["constant", "linear", "cosine"])
def test_step_schedules_follow_lr_at_and_ignore_observe(name):
    kw = dict(total_steps=12, name=name, warmup_steps=2, min_lr_ratio=0.1)
    opt = make_opt()
    sched = make_scheduler(opt, **kw)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    lrs = []
    for _ in range(15):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        sched.observe(0.0)  # a metric that never improves: no effect outside "plateau"
    assert lrs == pytest.approx([lr_at(s, base_lr=3e-3, **kw) for s in range(15)], rel=1e-12)
    assert sched.get_last_lr() == [opt.param_groups[0]["lr"]]


# lmrl's schedule -> transformers.get_scheduler's name and extra arguments for the same lrs
TRANSFORMERS_TWINS = [
    (dict(name="constant"), "constant_with_warmup", {}),
    (dict(name="linear", min_lr_ratio=0.0), "linear", {}),
    (dict(name="cosine", min_lr_ratio=0.0), "cosine", {}),
    (dict(name="cosine", min_lr_ratio=0.1), "cosine_with_min_lr", {"min_lr_rate": 0.1}),
    *[(dict(name="wsd", min_lr_ratio=ratio, decay_steps=10, decay_shape=shape), "warmup_stable_decay",
       {"num_decay_steps": 10, "min_lr_ratio": ratio, "decay_type": shape})
      for shape in ("cosine", "linear", "1-sqrt") for ratio in (0.0, 0.1)],
]


@pytest.mark.parametrize("warmup", [0, 1, 7])
@pytest.mark.parametrize("ours, theirs, extra", TRANSFORMERS_TWINS)
def test_step_schedules_are_transformers_schedules_step_by_step(ours, theirs, extra, warmup):
    from transformers import get_scheduler

    total = 30
    opt_ours, opt_theirs = make_opt(), make_opt()
    ours = train_steps(opt_ours, make_scheduler(opt_ours, total_steps=total, warmup_steps=warmup, **ours), total + 1)
    hf = get_scheduler(theirs, opt_theirs, num_warmup_steps=warmup, num_training_steps=total,
                       scheduler_specific_kwargs=extra)
    theirs = train_steps(opt_theirs, hf, total + 1)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15)  # steps 0 .. T: every lr the run uses


def test_every_schedule_name_builds_a_scheduler():
    for name in SCHEDULES:
        sched = make_scheduler(make_opt(), total_steps=10, name=name, decay_steps=3)
        assert isinstance(sched, PlateauScheduler if name == "plateau" else StepScheduler)


def plateau(lr=1.0, **kw):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    settings = dict(name="plateau", warmup_steps=0, min_lr_ratio=0.1, plateau_patience=2)
    settings.update(kw)
    return opt, make_scheduler(opt, total_steps=100, **settings)


def lr_of(opt):
    return opt.param_groups[0]["lr"]


def test_plateau_warmup_still_applies():
    opt, sched = plateau(warmup_steps=4)
    lrs = train_steps(opt, sched, 6)
    assert lrs == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0])
    assert sched.get_last_lr() == pytest.approx([1.0])


def test_plateau_halves_after_patience_evaluations_without_improvement():
    opt, sched = plateau()
    sched.observe(0.5)  # the first evaluation sets the best
    sched.observe(0.5)  # 1 bad evaluation: patience 2 not reached
    assert lr_of(opt) == pytest.approx(1.0)
    sched.observe(0.5004)  # better, but by less than threshold 1e-3 relative (0.5005): still bad
    assert lr_of(opt) == pytest.approx(0.5)
    train_steps(opt, sched, 3)  # the cut lasts across steps
    assert lr_of(opt) == pytest.approx(0.5)


def test_plateau_improvement_beyond_threshold_resets_the_count():
    opt, sched = plateau()
    for metric in (0.5, 0.4, 0.5006, 0.5, 0.3):  # 0.5006 > 0.5005 improves and resets the count
        sched.observe(metric)
    assert lr_of(opt) == pytest.approx(0.5)  # cut once, at the second bad one after the reset
    sched.observe(0.5)
    assert lr_of(opt) == pytest.approx(0.5)


def test_plateau_never_goes_below_the_floor():
    opt, sched = plateau(min_lr_ratio=0.3, plateau_patience=1)
    lrs = []
    for metric in (1.0, 0.0, 0.0, 0.0, 0.0):
        sched.observe(metric)
        lrs.append(lr_of(opt))
    assert lrs == pytest.approx([1.0, 0.5, 0.3, 0.3, 0.3])


def test_plateau_min_mode_cuts_when_the_loss_stops_falling():
    opt, sched = plateau(plateau_mode="min", plateau_patience=1, plateau_factor=0.1, min_lr_ratio=0.0)
    for loss in (3.0, 2.0, 1.0):
        sched.observe(loss)
    assert lr_of(opt) == pytest.approx(1.0)
    sched.observe(1.0)
    assert lr_of(opt) == pytest.approx(0.1)


def test_plateau_threshold_is_relative_to_the_size_of_the_best_metric_of_either_sign():
    opt, sched = plateau(plateau_patience=1, plateau_threshold=0.1)
    sched.observe(-2.0)
    sched.observe(-1.9)  # needs > -2 + 0.1 * 2 = -1.8
    assert lr_of(opt) == pytest.approx(0.5)
    sched.observe(-1.7)
    assert lr_of(opt) == pytest.approx(0.5)


def test_plateau_evaluations_during_warmup_do_not_count_as_bad():
    opt, sched = plateau(warmup_steps=4, plateau_patience=1)
    sched.observe(0.5)
    train_steps(opt, sched, 1)
    sched.observe(0.1)  # step 1 of 4: no cut, the lr is still rising
    assert lr_of(opt) == pytest.approx(0.25)
    train_steps(opt, sched, 3)
    assert lr_of(opt) == pytest.approx(1.0)
    sched.observe(0.1)  # warm-up over: the first bad evaluation cuts (patience 1)
    assert lr_of(opt) == pytest.approx(0.5)


def test_plateau_a_nan_metric_counts_as_no_improvement():
    opt, sched = plateau(plateau_patience=2)
    sched.observe(float("nan"))  # bad 1
    sched.observe(0.5)  # NaN never became the best: 0.5 improves and resets the count
    sched.observe(float("nan"))  # bad 1
    assert lr_of(opt) == pytest.approx(1.0)
    sched.observe(float("nan"))  # bad 2: cut
    assert lr_of(opt) == pytest.approx(0.5)


@pytest.mark.parametrize("bad, match", [(dict(plateau_mode="up"), "mode"), (dict(plateau_factor=1.0), "factor"),
                                        (dict(plateau_patience=0), "patience"),
                                        (dict(plateau_threshold=-0.1), "threshold")])
def test_bad_plateau_settings_are_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        plateau(**bad)


# (steps before the evaluation, metric): cuts at evaluations 4 and 8; the first 5 end one bad evaluation in
PLATEAU_SCRIPT = [(2, 0.2), (2, 0.4), (1, 0.4), (3, 0.39), (2, 0.3), (2, 0.5), (1, 0.5), (2, 0.45), (3, 0.6)]
PLATEAU = dict(total_steps=30, name="plateau", warmup_steps=3, min_lr_ratio=0.1, plateau_patience=2)


def run_script(opt, sched, script):
    lrs = []
    for steps, metric in script:
        lrs += train_steps(opt, sched, steps)
        sched.observe(metric)
    return lrs


def test_plateau_state_dict_round_trip_resumes_the_same_lrs():
    opt = make_opt()
    straight = run_script(opt, make_scheduler(opt, **PLATEAU), PLATEAU_SCRIPT)
    assert min(straight) < 3e-3 - 1e-9 and straight[-1] == pytest.approx(0.75e-3)  # two cuts happened

    opt = make_opt()
    sched = make_scheduler(opt, **PLATEAU)
    first = run_script(opt, sched, PLATEAU_SCRIPT[:5])
    assert sched.bad_evals == 1 and sched.scale == 0.5  # mid-count, after a cut
    saved = {"opt": opt.state_dict(), "sched": sched.state_dict()}
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)  # as lmrl.checkpoint loads it

    opt2 = make_opt()
    sched2 = make_scheduler(opt2, **PLATEAU)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    assert first + run_script(opt2, sched2, PLATEAU_SCRIPT[5:]) == straight


def test_plateau_refuses_state_from_another_schedule():
    opt = make_opt()
    cosine_state = make_scheduler(opt, **SCHED).state_dict()
    with pytest.raises(ValueError, match="plateau"):
        make_scheduler(make_opt(), **PLATEAU).load_state_dict(cosine_state)


def test_wsd_holds_the_peak_between_warmup_and_its_last_decay_steps():
    kw = dict(base_lr=1.0, total_steps=20, name="wsd", warmup_steps=4, min_lr_ratio=0.1, decay_steps=8,
              decay_shape="linear")
    assert lr_at(0, **kw) == pytest.approx(0.1)  # the warm-up starts at the floor
    assert lr_at(2, **kw) == pytest.approx(0.55)
    assert [lr_at(s, **kw) for s in range(4, 13)] == [1.0] * 9  # stable: steps 4 .. T − D = 12
    assert lr_at(16, **kw) == pytest.approx(0.55)  # halfway through the decay
    assert lr_at(20, **kw) == pytest.approx(0.1) == lr_at(25, **kw)


def test_wsd_1_sqrt_decay_matches_hand_computed_value():
    kw = dict(base_lr=2.0, total_steps=10, name="wsd", min_lr_ratio=0.0, decay_steps=4, decay_shape="1-sqrt")
    assert lr_at(7, **kw) == pytest.approx(2.0 * (1 - 0.25 ** 0.5))  # p = (7 − 10 + 4) / 4


@pytest.mark.parametrize("kw, match", [
    (dict(decay_steps=0), "decay_steps must be >= 1, got 0"),
    (dict(decay_steps=8, warmup_steps=5), r"warmup_steps \(5\) and decay_steps \(8\) add up to more than the run's 10"),
    (dict(decay_steps=3, decay_shape="exp"), "decay_shape must be one of cosine, linear, 1-sqrt, got 'exp'"),
])
def test_bad_wsd_settings_are_refused_when_the_scheduler_is_made(kw, match):
    with pytest.raises(ValueError, match=match):
        make_scheduler(make_opt(), total_steps=10, name="wsd", **kw)
