"""benchmarks/real_preferences.py without a model: which rows it picks, the interval it prints, and
that its lmrl overrides are valid keys of both presets (the benchmark itself needs TRL and minutes)."""

import importlib.util
from pathlib import Path

import pytest

from lmrl.config import load_config

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "real_preferences.py"
_spec = importlib.util.spec_from_file_location("real_preferences", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


class WordTokenizer:
    """One token per word, like an HF tokenizer's call."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}


def test_select_rows_takes_the_first_fitting_rows_of_the_span_by_line_number():
    rows = [{"chosen": "a " * n, "rejected": "b"} for n in (1, 9, 2, 3, 9, 4, 1)]
    fits = bench.length_filter(WordTokenizer(), max_length=5)  # a side fits with <= 4 words + the end token
    assert bench.select_rows(rows, (2, 7), 3, fits) == ([3, 4, 6], 2)
    assert bench.select_rows(rows, (2, 3), 5, fits) == ([3], 1)  # the span's end bounds the search


def test_select_rows_passes_over_pairs_whose_sides_are_the_same():
    rows = [{"chosen": "same ", "rejected": " same"}, {"chosen": "x", "rejected": "y"}]
    assert bench.select_rows(rows, (1, 2), 2, bench.length_filter(WordTokenizer(), 8)) == ([2], 1)


def test_spans_compresses_consecutive_row_numbers():
    assert bench.spans([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"
    assert bench.spans([5]) == "5"


def test_verdicts_apply_the_three_targets_and_bound_the_paired_difference():
    trl = {"accuracy": 0.60, "margins": [1.0] * 60 + [-1.0] * 40, "train_s": 100.0, "peak_rss_mib": 1000.0}
    worse = {"accuracy": 0.50, "margins": [1.0] * 50 + [-1.0] * 50, "train_s": 40.0, "peak_rss_mib": 1100.0}
    v = bench.verdicts(worse, trl)
    assert v["accuracy_points_vs_trl"] == (pytest.approx(-10.0), "FAIL")
    assert v["time_ratio"] == (pytest.approx(0.4), "PASS")
    assert v["rss_ratio"] == (pytest.approx(1.1), "FAIL")
    low, high = v["accuracy_points_ci95"][0]
    assert low < -10.0 < high < 0  # ten pairs, all lost by lmrl: a loss the interval shows

    same = bench.verdicts({**trl, "train_s": 50.0}, trl)
    assert same["accuracy_points_vs_trl"] == (0.0, "PASS") and same["time_ratio"][1] == "PASS"
    low, high = same["accuracy_points_ci95"][0]
    assert low < 0 < high and low == pytest.approx(-high)


@pytest.mark.parametrize("task", ["rm", "dpo"])
def test_lmrl_overrides_load_on_the_preset(task, tmp_path):
    args = bench.parse_args(["--cache-dir", str(tmp_path / "model"), "--batch-size", "16", "--micro-batch", "4"])
    args.train_file, args.steps = tmp_path / "train.jsonl", 37  # what main() sets after picking the rows
    cfg = load_config(bench.TASKS[task][1], bench.lmrl_overrides(args, task, 2e-4, tmp_path / "run"))
    assert cfg.data.eval_file is None and cfg.data.generate == "" and cfg.data.chat is False
    assert (cfg.train.max_steps, cfg.data.batch_size, cfg.train.ga_steps) == (37, 16, 4)
    assert (cfg.optim.lr, list(cfg.optim.betas), cfg.schedule.min_lr_ratio) == (2e-4, [0.9, 0.999], 0.0)
    assert list(cfg.lora.target_modules) == bench.ALL_LINEAR.split(",") and cfg.train.patience == 0
