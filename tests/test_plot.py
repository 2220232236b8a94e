"""`lmrl plot`: one PNG per metric family with data, read from a run's metrics.jsonl."""

import argparse
import json
import math

import pytest

from lmrl.log.plot import FAMILIES, add_parser, family_figures, is_rate, plot_run, read_metrics, run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_metrics(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def rl_rows(steps=12):
    """SFT then RL: train metrics every step, eval every 4th, an SFT stage at the start."""
    rows = [{"step": s, "sft/loss": 2.0 / s, "sft/lr": 1e-3} for s in (1, 2)]
    for s in range(3, steps + 1):
        row = {"step": s, "train/policy_loss": -0.1 * s, "train/value_loss": 1.0 / s, "train/kl": 0.01 * s,
               "train/approx_kl": 0.005 * s, "train/entropy": 1.5 - 0.05 * s, "rollout/reward_mean": 0.1 * s,
               "train/lr": 3e-4, "time/step_s": 0.5}
        if s % 4 == 0:
            row.update({"eval/accuracy": s / steps, "eval/reward_mean": 0.08 * s})
        rows.append(row)
    return rows


def assert_png(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 0 and pixels.shape[1] > 0


def test_every_family_with_data_gets_a_valid_png_in_run_dir_plots(tmp_path):
    run_dir = tmp_path / "run"
    write_metrics(run_dir, rl_rows())
    paths = plot_run(run_dir)
    assert [p.name for p in paths] == ["loss.png", "accuracy.png", "reward.png", "kl.png", "entropy.png", "lr.png",
                                       "eval.png"]
    assert all(p.parent == run_dir / "plots" for p in paths)
    for path in paths:
        assert_png(path)
    assert not [p for p in (run_dir / "plots").iterdir() if p.name.startswith(".")]  # no temp file left


def test_families_without_data_make_no_file(tmp_path):
    run_dir = tmp_path / "dpo"
    write_metrics(run_dir, [{"step": s, "dpo/loss": 0.7 - 0.01 * s, "rewards/accuracy": 0.5 + 0.01 * s,
                             "rewards/margins": 0.1 * s, "time/step_s": 0.2} for s in range(1, 6)])
    paths = plot_run(run_dir)
    assert [p.name for p in paths] == ["loss.png", "accuracy.png", "reward.png"]
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == ["accuracy.png", "loss.png", "reward.png"]


def test_out_dir_replaces_run_dir_plots(tmp_path):
    run_dir = tmp_path / "run"
    write_metrics(run_dir, [{"step": 1, "sft/loss": 1.0}, {"step": 2, "sft/loss": 0.5}])
    paths = plot_run(run_dir, out_dir=tmp_path / "curves")
    assert paths == [tmp_path / "curves" / "loss.png"]
    assert_png(paths[0])
    assert not (run_dir / "plots").exists()


def test_family_membership_follows_the_metric_vocabulary():
    members = {stem: belongs for stem, _, _, belongs in FAMILIES}
    assert all(members["loss"](k) for k in ("sft/loss", "train/policy_loss", "train/value_loss", "dpo/loss", "rm/loss"))
    assert all(members["reward"](k) for k in ("rollout/reward_mean", "eval/reward_mean", "rewards/chosen",
                                              "train/avg_reward", "rm/margin_mean", "rm/chosen_mean",
                                              "eval/margin_mean"))
    rates = ("train/accuracy", "sft/accuracy", "sft/token_accuracy", "rewards/accuracy", "rewards/accuracies",
             "rm/accuracy", "eval/accuracy", "eval/warmup_accuracy", "rollout/format_rate", "train/clip_frac")
    assert all(members["accuracy"](k) and not members["reward"](k) for k in rates)
    assert not any(is_rate(k) for k in ("train/avg_reward", "rewards/margins", "train/lr", "dpo/loss", "train/kl"))
    assert all(members["kl"](k) for k in ("train/kl", "train/approx_kl", "rollout/kl"))
    assert not members["kl"]("train/kl_coef")
    assert members["entropy"]("train/entropy") and members["lr"]("sft/lr") and members["eval"]("eval/accuracy")
    assert not members["lr"]("train/lr_scale") and not members["reward"]("train/reward_loss")


def test_missing_keys_and_non_finite_values_are_gaps_not_zeros(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/kl": 0.1}\n\n{"step": 2, "eval/accuracy": 0.5}\n'
                    '{"step": 3, "train/kl": NaN, "eval/accuracy": Infinity, "flag": true, "note": "x"}\n',
                    encoding="utf-8")
    series = read_metrics(path)
    assert series["train/kl"][0] == [1, 3] and series["train/kl"][1][0] == 0.1 and math.isnan(series["train/kl"][1][1])
    assert series["eval/accuracy"][0] == [2, 3] and math.isnan(series["eval/accuracy"][1][1])
    assert set(series) == {"train/kl", "eval/accuracy"}  # booleans and strings are not curves
    assert [p.name for p in plot_run(tmp_path)] == ["accuracy.png", "kl.png", "eval.png"]


def test_a_family_whose_values_are_all_non_finite_makes_no_file(tmp_path):
    write_metrics(tmp_path, [{"step": 1, "train/kl": float("nan"), "sft/loss": 1.0}])
    assert [p.name for p in plot_run(tmp_path)] == ["loss.png"]


def test_a_missing_metrics_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "metrics.jsonl")):
        plot_run(tmp_path)


@pytest.mark.parametrize("bad", ['{"step": 3, "sft/loss": 0.', '[1, 2]', '{"sft/loss": 0.5}', '{"step": "3"}'])
def test_a_malformed_line_is_named_by_path_and_line_number(tmp_path, bad):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "sft/loss": 1.0}\n{"step": 2, "sft/loss": 0.9}\n' + bad + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:3"):
        plot_run(tmp_path)
    assert not (tmp_path / "plots").exists()  # nothing written from a file that did not read


def test_a_second_call_replaces_the_plots(tmp_path):
    write_metrics(tmp_path, rl_rows(8))
    first = plot_run(tmp_path)
    write_metrics(tmp_path, rl_rows(16))
    assert plot_run(tmp_path) == first
    for path in first:
        assert_png(path)


def drawn(figure):
    """Per axis, top to bottom: (y label, legend label of each line drawn)."""
    return [(ax.get_ylabel(), [line.get_label() for line in ax.get_lines()]) for ax in figure.axes]


def figures_of(tmp_path, rows):
    return dict(family_figures(read_metrics(write_metrics(tmp_path, rows)), "run"))


def dpo_rows(steps=6):
    """DPO as it logs, with TRL's rewards/accuracies beside rewards/accuracy; eval every 3rd step."""
    rows = []
    for s in range(1, steps + 1):
        row = {"step": s, "dpo/loss": 0.69 - 0.05 * s, "dpo/lr": 1e-4, "rewards/chosen": 0.1 * s,
               "rewards/rejected": -0.1 * s, "rewards/margins": 0.2 * s, "rewards/accuracy": min(1.0, 0.2 * s),
               "rewards/accuracies": min(1.0, 0.2 * s)}
        if s % 3 == 0:
            row.update({"eval/loss": 0.6 - 0.05 * s, "eval/accuracy": 0.5 + 0.05 * s,
                        "eval/rewards/accuracy": 0.5 + 0.05 * s, "eval/rewards/margins": 0.3 * s})
        rows.append(row)
    return rows


def test_rates_get_their_own_0_to_1_panel_below_the_unbounded_values(tmp_path):
    figures = figures_of(tmp_path, dpo_rows())
    assert list(figures) == ["loss", "accuracy", "reward", "lr", "eval"]
    assert drawn(figures["reward"]) == [("reward", ["rewards/chosen", "rewards/margins", "rewards/rejected"])]
    assert drawn(figures["accuracy"]) == [("fraction", ["eval/accuracy = eval/rewards/accuracy",
                                                        "rewards/accuracies = rewards/accuracy"])]
    assert figures["accuracy"].axes[0].get_ylim() == (-0.05, 1.05)
    top, bottom = figures["eval"].axes
    assert drawn(figures["eval"]) == [("value", ["eval/loss", "eval/rewards/margins"]),
                                      ("fraction (0-1)", ["eval/accuracy = eval/rewards/accuracy"])]
    assert bottom.get_ylim() == (-0.05, 1.05)
    assert top.get_shared_x_axes().joined(top, bottom)  # one step axis for both panels
    assert top.get_title() == "Evaluation: run" and bottom.get_xlabel() == "step" and top.get_xlabel() == ""


def test_a_rate_panel_widens_to_show_a_value_outside_0_1(tmp_path):
    figures = figures_of(tmp_path, [{"step": 1, "train/accuracy": 0.5}, {"step": 2, "train/accuracy": 1.25}])
    assert figures["accuracy"].axes[0].get_ylim() == (-0.05, 1.25)


def test_a_series_identical_to_one_drawn_is_named_in_its_legend_not_drawn_again(tmp_path):
    nan = float("nan")
    rows = [{"step": s, "train/avg_reward": r, "rollout/reward_mean": r, "eval/reward": r,
             "train/policy_loss": l, "train/loss": l, "train/value_loss": l + 1} for s, r, l in
            [(1, 0.1, 0.5), (2, nan, 0.4), (3, 0.3, 0.3)]]
    rows.append({"step": 4, "eval/reward": 0.4})  # eval/reward has a fourth point: not the same series
    figures = figures_of(tmp_path, rows)
    assert drawn(figures["reward"]) == [("reward", ["eval/reward", "rollout/reward_mean = train/avg_reward"])]
    assert drawn(figures["loss"]) == [("loss", ["train/loss = train/policy_loss", "train/value_loss"])]
    line = figures["reward"].axes[0].get_lines()[1]
    assert list(line.get_xdata()) == [1, 2, 3] and line.get_ydata()[0] == 0.1 and math.isnan(line.get_ydata()[1])
    legend = [t.get_text() for t in figures["reward"].axes[0].get_legend().get_texts()]
    assert legend == ["eval/reward", "rollout/reward_mean = train/avg_reward"]


def test_the_same_values_at_other_steps_are_another_series(tmp_path):
    rows = [{"step": 1, "train/kl": 0.1}, {"step": 2, "train/kl": 0.2, "rollout/kl": 0.1},
            {"step": 3, "rollout/kl": 0.2}]
    assert drawn(figures_of(tmp_path, rows)["kl"]) == [("KL", ["rollout/kl", "train/kl"])]


def test_written_pngs_are_the_figures_family_figures_builds(tmp_path):
    write_metrics(tmp_path, dpo_rows())
    stems = [stem for stem, _ in family_figures(read_metrics(tmp_path / "metrics.jsonl"), "x")]
    assert [p.stem for p in plot_run(tmp_path)] == stems


def parse(argv):
    parser = argparse.ArgumentParser(prog="lmrl")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_the_plot_command_prints_the_written_files(tmp_path, capsys):
    write_metrics(tmp_path / "run", rl_rows())
    args = parse(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert args.command == "plot" and args.out == tmp_path / "out"
    assert run(args) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "out" / f"{stem}.png") for stem in ("loss", "accuracy", "reward", "kl",
                                                                           "entropy", "lr", "eval")]


def test_the_plot_command_reports_a_bad_line_and_an_empty_file_in_one_line(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("not json\n", encoding="utf-8")
    assert run(parse(["plot", str(tmp_path)])) == 1
    assert capsys.readouterr().err.strip() == f"lmrl plot: error: {path}:1: not a JSON line " \
                                              "(Expecting value: line 1 column 1 (char 0))"
    path.write_text('{"step": 1, "time/step_s": 0.1}\n', encoding="utf-8")
    assert run(parse(["plot", str(tmp_path)])) == 1
    assert "nothing to plot" in capsys.readouterr().err
