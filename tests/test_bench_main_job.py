"""benchmarks/main_job.py: time to the first evaluation at the target, and the ratios against the first arm."""

from benchmarks.main_job import report, time_to

ROWS = [{"step": 10, "time/elapsed_s": 5.0, "eval/accuracy": 0.5}, {"step": 20, "time/elapsed_s": 9.0},
        {"step": 30, "time/elapsed_s": 14.0, "eval/accuracy": 0.991}, {"step": 40, "time/elapsed_s": 20.0,
                                                                      "eval/accuracy": 0.999}]


def test_time_to_is_the_first_evaluation_at_or_above_the_target():
    assert time_to(ROWS, 0.99) == (14.0, 30)
    assert time_to(ROWS, 0.5) == (5.0, 10)
    assert time_to(ROWS, 1.0) == (None, None)


def test_the_ratio_is_each_arms_time_to_target_over_the_first_arms():
    summary = {"warmup_accuracy": 0.2, "final_accuracy": 0.999, "rl_gain": 0.799}
    fast = [dict(r, **{"time/elapsed_s": r["time/elapsed_s"] / 2}) for r in ROWS]
    never = [r for r in ROWS if r.get("eval/accuracy", 0) < 0.9]
    table = report([{"arm": "a", "wall_s": 30.0, "rows": ROWS, "summary": summary},
                    {"arm": "b", "wall_s": 16.0, "rows": fast, "summary": summary},
                    {"arm": "c", "wall_s": 9.0, "rows": never, "summary": summary}], 0.99)
    assert [(t["to_target_s"], t["ratio"]) for t in table] == [(14.0, 1.0), (7.0, 0.5), (None, None)]
