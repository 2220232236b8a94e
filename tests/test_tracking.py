"""EvalTracker (lmrl/train/tracking.py) on hand-computed sequences: improvement by more than the
threshold in the metric's direction, patience, the stopping target, and its record resumed exactly."""

import json

import pytest

from lmrl.train.tracking import EvalTracker, lower_is_better


def run(tracker, values, first_step=1):
    """Observe `values` at consecutive steps; (improved, stop) per evaluation."""
    return [(v.improved, v.stop) for v in (tracker.observe(first_step + i, value) for i, value in enumerate(values))]


def test_a_gain_counts_only_when_it_beats_the_best_by_more_than_the_threshold():
    tracker = EvalTracker("eval/accuracy", min_delta=0.05)
    # 0.5 first (best); 0.53 is +0.03 (no); 0.56 is +0.06 over 0.5 (yes); 0.6 is +0.04 over 0.56 (no)
    assert run(tracker, [0.5, 0.53, 0.56, 0.6]) == [(True, None), (False, None), (True, None), (False, None)]
    assert tracker.best == {"value": 0.56, "step": 3}
    assert tracker.state["evals_without_gain"] == 1
    assert tracker.state["history"] == [[1, 0.5], [2, 0.53], [3, 0.56], [4, 0.6]]


def test_a_loss_is_minimised_and_an_equal_value_is_no_gain():
    assert lower_is_better("eval/loss") and not lower_is_better("eval/accuracy")
    tracker = EvalTracker("eval/loss")
    assert [v for v, _ in run(tracker, [2.0, 1.5, 1.5, 1.6, 1.4])] == [True, True, False, False, True]
    assert tracker.best == {"value": 1.4, "step": 5} and tracker.state["evals_without_gain"] == 0


def test_patience_evaluations_in_a_row_without_a_gain_stop_and_a_gain_resets_the_count():
    tracker = EvalTracker("eval/accuracy", patience=2)
    # 0.4: 1 without a gain; 0.6: a gain, count 0; 0.5, 0.5: 1, then 2 = patience
    assert run(tracker, [0.5, 0.4, 0.6, 0.5, 0.5]) == [(True, None), (False, None), (True, None), (False, None),
                                                       (False, "patience")]
    assert tracker.stopped and tracker.best == {"value": 0.6, "step": 3}
    assert not EvalTracker("eval/accuracy").observe(1, 0.5).stop  # patience 0: never
    no_patience = EvalTracker("eval/accuracy")
    assert run(no_patience, [0.5] * 5)[-1] == (False, None) and not no_patience.stopped


@pytest.mark.parametrize("metric, values, target", [("eval/accuracy", [0.8, 0.9], 0.9), ("eval/loss", [0.3, 0.1], 0.1)])
def test_reaching_the_target_in_the_metrics_direction_stops(metric, values, target):
    tracker = EvalTracker(metric, stop_at=target)
    assert run(tracker, values) == [(True, None), (True, "threshold")]
    assert tracker.stopped


def test_a_stopped_run_is_not_stopped_again_by_the_target():
    tracker = EvalTracker("eval/accuracy", stop_at=0.5)
    tracker.state["stopped_early"] = True  # e.g. a TRL callback's should_training_stop
    assert run(tracker, [0.9]) == [(True, None)]


def test_the_new_best_keeps_what_it_is_given_and_the_last_evaluation_is_known():
    tracker = EvalTracker("eval/reward")
    tracker.observe(4, 0.25, accuracy=0.75)
    assert tracker.best == {"value": 0.25, "step": 4, "accuracy": 0.75}
    assert tracker.evaluated_at(4) and not tracker.evaluated_at(5)
    assert not EvalTracker("eval/reward").evaluated_at(0)


def test_the_record_resumed_from_json_continues_exactly():
    values = [0.5, 0.4, 0.7, 0.69, 0.65, 0.8, 0.8, 0.79, 0.78]
    rules = dict(min_delta=0.01, patience=3, stop_at=0.95)
    whole = EvalTracker("eval/accuracy", **rules)
    expected = run(whole, values)
    # the record lives inside the trainer state, which holds other keys the tracker leaves alone
    state = {"step": 0, **EvalTracker.initial_state(), "time": {"wall": 1.0}}
    first = EvalTracker("eval/accuracy", **rules, state=state)
    got = run(first, values[:4])
    assert list(state) == ["step", "best", "evals_without_gain", "stopped_early", "history", "time"]
    loaded = json.loads(json.dumps(state))  # what a checkpoint's trainer_state.json gives back
    second = EvalTracker("eval/accuracy", **rules, state=loaded)
    got += run(second, values[4:], first_step=5)
    assert got == expected
    assert loaded["time"] == {"wall": 1.0} and loaded["step"] == 0
    assert {k: loaded[k] for k in EvalTracker.initial_state()} == whole.state
    # 0.7 beats 0.5 by more than 0.01; 0.69, 0.65 do not; 0.8 does; 0.8, 0.79, 0.78: 3 = patience at step 9
    assert expected[-1] == (False, "patience") and expected[5] == (True, None)
    assert whole.best == {"value": 0.8, "step": 6} and whole.state["evals_without_gain"] == 3 and whole.stopped
