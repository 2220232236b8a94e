"""Following one eval metric over a run's evaluations: whether each one improved on the best so far
(by more than a threshold, in the metric's direction), how many evaluations in a row did not
(patience), and when to stop early (patience spent, or the metric reaching a target).

The tracker keeps its record in the dict it is given (the trainer's state, under the keys of
`EvalTracker.initial_state`), so a checkpoint of that dict resumes it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass


def lower_is_better(metric: str) -> bool:
    """Metrics named like a loss are minimised; every other metric is maximised."""
    return "loss" in metric


@dataclass
class Verdict:
    """What one evaluation decided: `improved` (it is the new best); `stop`: "patience" (that many
    evaluations without a gain), "threshold" (the metric reached the target) or None."""

    improved: bool
    stop: str | None = None


class EvalTracker:
    """The best value of `metric` and early stopping. An evaluation improves when it beats the best by
    more than `min_delta` (the first one always does); `patience` > 0 evaluations in a row without
    a gain stop the run, as does reaching `stop_at` (None: no target). Loss-like metrics
    (`lower_is_better`) are minimised, others maximised."""

    def __init__(self, metric: str, *, min_delta: float = 0.0, patience: int = 0, stop_at: float | None = None,
                 state: dict | None = None):
        self.metric = metric
        self.min_delta = min_delta
        self.patience = patience
        self.stop_at = stop_at
        self.sign = -1.0 if lower_is_better(metric) else 1.0
        self.state = self.initial_state() if state is None else state

    @staticmethod
    def initial_state() -> dict:
        """The record before any evaluation: "best" ({"value", "step"} and what `observe` adds),
        "evals_without_gain", "stopped_early" and "history" ([step, value] per evaluation)."""
        return {"best": {"value": None, "step": 0}, "evals_without_gain": 0, "stopped_early": False, "history": []}

    @property
    def best(self) -> dict:
        return self.state["best"]

    @property
    def stopped(self) -> bool:
        return self.state["stopped_early"]

    def evaluated_at(self, step: int) -> bool:
        """Whether the latest evaluation was at `step`."""
        history = self.state["history"]
        return bool(history) and history[-1][0] == step

    def observe(self, step: int, value: float, **best_info) -> Verdict:
        """Record the evaluation at `step` whose metric is `value`; a new best is stored as
        {"value", "step", **best_info}. A run already stopped is not stopped again by the target."""
        state = self.state
        state["history"].append([step, value])
        best = state["best"]["value"]
        verdict = Verdict(improved=best is None or self.sign * (value - best) > self.min_delta)
        if verdict.improved:
            state["best"] = {"value": value, "step": step, **best_info}
            state["evals_without_gain"] = 0
        else:
            state["evals_without_gain"] += 1
            if self.patience and state["evals_without_gain"] >= self.patience:
                state["stopped_early"] = True
                verdict.stop = "patience"
        if self.stop_at is not None and self.reached(value) and not state["stopped_early"]:
            state["stopped_early"] = True
            verdict.stop = "threshold"
        return verdict

    def reached(self, value: float) -> bool:
        """Whether `value` reaches the target `stop_at` in the metric's direction."""
        return self.sign * (value - self.stop_at) >= 0
