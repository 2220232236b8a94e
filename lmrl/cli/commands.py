"""`lmrl` command line: a thin layer over the Python API.

    lmrl train adder [key=value ...] [--resume] [--debug] [--no-wandb] [--device D] [--algorithm NAME]
               [--config PATH | --config_name NAME] [--resume_from_checkpoint CKPT_DIR]
    lmrl train --help                                    the flags, then every config key with its default
    lmrl config [PRESET] [key=value ...]                 every key with the preset's value and help text (YAML)
    lmrl eval RUN_DIR [--checkpoint best|latest|step_N] [--size N]
    lmrl eval RUN_DIR|MODEL TEST_FILE [--limit N] [--max-new-tokens N] [--batch-size N] [--out FILE] [--no-chat]
                                      [--system-prompt S] [--prompt-template T] [--prompt-key K] [--label-key K]
                                      [--require-format] [--temperature T]
                                      [--adapter DIR]      a PEFT LoRA adapter on MODEL (a TRL run's output)
    lmrl generate RUN_DIR "123+456=" [...] [--checkpoint ...] [--temperature T]
    lmrl export RUN_DIR [--out DIR] [--checkpoint ...]   a merged model transformers loads
    lmrl data KIND OUT_DIR [--train N] [--test N] [--seed S] [--config PRESET] [--kinds ...] ...   a registered
                                                         generator: word-problems, addition-chat, preferences,
                                                         preferences-sft, sql-demos (`lmrl data --help`)
    lmrl prepare-data --datasets hh-rlhf gsm8k belle alpaca-chinese [--hf NAME] [--from PATH] [--max-samples N]
                      [--skip-bad-rows] [--rg-tasks NAME ... --size N --seed S --rg-config KEY=VALUE ...]
    lmrl plot RUN_DIR [--out DIR]                        PNG curves from metrics.jsonl (default RUN_DIR/plots)
    lmrl plan PRESET [key=value ...] [--device h100|h200|a100|cpu] [--device-memory GB] [--world-size N] [--json]
                                                         memory per device and a step-time estimate, nothing loaded
    lmrl presets
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import signal
import sys
from pathlib import Path

def _parser(key_reference: bool = False) -> argparse.ArgumentParser:
    """The command line's parser; with `key_reference`, `train --help` ends with every config key."""
    p = argparse.ArgumentParser(prog="lmrl", description="RL post-training of language models")
    sub = p.add_subparsers(dest="command", required=True)

    reference = None
    if key_reference:  # read only for `train --help`: the schema imports torch
        from ..config import describe_config

        reference = ("config keys (override any as section.key=value; TRL's names are accepted too), with their "
                     "defaults:\n\n" + describe_config())
    t = sub.add_parser("train", help="train from a preset or YAML file, with key=value overrides", epilog=reference,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("config", nargs="?", default=None, help="preset name (adder, multiplier, AdderRLConfig, ...) or "
                                                           "YAML path (default adder)")
    t.add_argument("overrides", nargs="*", help="config overrides such as train.steps=50 optim.lr=3e-4")
    t.add_argument("--config", "--config_name", dest="config_option", metavar="PRESET_OR_PATH",
                   help="the preset or YAML file, as a flag (the seed system's spelling)")
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run dir")
    t.add_argument("--resume_from_checkpoint", "--resume-from-checkpoint", metavar="CKPT_DIR",
                   help="continue from exactly this checkpoint dir (run.resume=auto run.resume_from=CKPT_DIR)")
    t.add_argument("--debug", action="store_true", help="the preset shrunk to a run of seconds after the model loads: "
                   "every stage it has, few steps, a few held-out rows (see lmrl.config.debug_overrides)")
    t.add_argument("--no-wandb", "--no_wandb", action="store_true", help="turn Weights & Biases logging off")
    t.add_argument("--algorithm", metavar="NAME", help="the RL algorithm (algo.name=NAME)")
    t.add_argument("--device", metavar="DEVICE", help="auto | cpu | cuda | cuda:N (run.device=DEVICE)")

    c = sub.add_parser("config", help="print every config key with a preset's value and help text, as YAML")
    c.add_argument("config", nargs="?", default=None, help="preset name or YAML path (default: the defaults)")
    c.add_argument("overrides", nargs="*", help="config overrides such as train.steps=50")

    e = sub.add_parser("eval", help="held-out accuracy of a run's model, or any model's (or run's) accuracy on a "
                                    "JSONL test file")
    e.add_argument("source", metavar="RUN_DIR|MODEL", help="a run dir; with TEST_FILE also any Hugging Face model: a "
                                                           "local dir, a .gguf file, smollm2-135m-instruct")
    e.add_argument("test_file", nargs="?", type=Path, default=None, metavar="TEST_FILE",
                   help="JSONL or parquet rows to answer and check: math {prompt, ground_truth} (e.g. prepare-data "
                        "--datasets gsm8k; verl's rows; other keys: --prompt-key, --label-key), reasoning-gym rows "
                        "(prepare-data --rg-tasks), DBBench records (SQL episodes)")
    e.add_argument("--checkpoint", default="latest", help="latest (default), best, step_N, or a checkpoint path")
    e.add_argument("--size", type=int, default=None, help="without TEST_FILE: number of held-out problems "
                                                          "(default: eval.size)")
    f = e.add_argument_group("with TEST_FILE (defaults: the run's task and reward settings, or the config defaults "
                             "with --no-require-format for a bare model)")
    f.add_argument("--limit", type=int, default=None, metavar="N", help="answer the first N rows (default: all)")
    f.add_argument("--max-new-tokens", type=int, default=None, metavar="N", help="longest completion (SQL: turn)")
    f.add_argument("--batch-size", type=int, default=None, metavar="N", help="rows answered at once (default 16)")
    f.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="every completion as JSONL (default RUN_DIR/eval/NAME.completions.jsonl, or "
                        "./MODEL-NAME.completions.jsonl)")
    f.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap each prompt as a user message in the model's chat template")
    f.add_argument("--system-prompt", default=None, metavar="TEXT", help="system message before each chat prompt")
    f.add_argument("--prompt-template", default=None, metavar="TEXT", help="how a row's prompt is asked; holds {prompt}")
    f.add_argument("--prompt-key", default=None, metavar="KEY",
                   help="the key holding a math row's prompt, a dotted path allowed (default: the run's "
                        "task.prompt_key, else prompt)")
    f.add_argument("--label-key", default=None, metavar="KEY",
                   help="the key holding a math row's ground truth, a dotted path allowed (default: the run's "
                        "task.label_key, else ground_truth or verl's reward_model.ground_truth)")
    f.add_argument("--require-format", action=argparse.BooleanOptionalAction, default=None,
                   help="count an answer only inside a well-formed <think>...</think> <answer>...</answer>")
    f.add_argument("--temperature", type=float, default=None, help="0 = greedy (default)")
    f.add_argument("--seed", type=int, default=None, help="sampling seed when --temperature > 0 (default 0)")
    f.add_argument("--device", default=None, help="auto (default) | cpu | cuda | cuda:N")
    f.add_argument("--adapter", type=Path, default=None, metavar="DIR",
                   help="a PEFT LoRA adapter (adapter_config.json + weights: a TRL output, an lmrl LoRA checkpoint) "
                        "put on MODEL, merged, before answering")

    g = sub.add_parser("generate", help="complete prompts with a run's model")
    g.add_argument("run_dir", type=Path)
    g.add_argument("prompts", nargs="+")
    g.add_argument("--checkpoint", default="latest")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")

    x = sub.add_parser("export", help="write a run's model as a plain transformers model (LoRA merged in)")
    x.add_argument("run_dir", type=Path)
    x.add_argument("--out", type=Path, default=None, help="output dir (default RUN_DIR/export)")
    x.add_argument("--checkpoint", default="latest")

    from ..tasks.registry import GENERATORS  # light: the generators' modules load when one runs

    d = sub.add_parser("data", help="write offline JSONL data sets (train.jsonl, test.jsonl)")
    d.add_argument("kind", choices=[name for name, g in GENERATORS.items() if not g.reads_source],
                   help="; ".join(f"{name}: {g.help}" for name, g in GENERATORS.items() if not g.reads_source))
    d.add_argument("out_dir", type=Path)
    d.add_argument("--train", type=int, default=None, help="training rows (default: the kind's own, "
                   + ", ".join(f"{n} {g.sizes[0]}" for n, g in GENERATORS.items() if not g.reads_source) + ")")
    d.add_argument("--test", type=int, default=None, help="held-out rows, never also in train (default: the kind's own, "
                   + ", ".join(f"{n} {g.sizes[1]}" for n, g in GENERATORS.items() if not g.reads_source) + ")")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--config", default=None, help="the preset or YAML a kind plays in (default: the kind's own, "
                   + ", ".join(f"{n} {g.preset}" for n, g in GENERATORS.items() if g.preset) + ")")
    options = {}
    for name, g in GENERATORS.items():
        for option, (default, text) in g.options.items():
            options.setdefault(option, (default, []))[1].append(f"{name}: {text} (default {default})")
    for option, (default, texts) in options.items():
        d.add_argument(f"--{option.replace('_', '-')}", dest=option, default=None, help="; ".join(texts))

    pl = sub.add_parser("plan", help="memory per device (weights, gradients, optimizer, activations, KV cache, "
                                     "vLLM) and a step-time estimate of a preset, before launching it")
    pl.add_argument("config", nargs="?", default=None, help="preset name or YAML path (default adder)")
    pl.add_argument("overrides", nargs="*", help="config overrides such as model.path=DIR train.rollout_size=64")
    pl.add_argument("--device", default=None, help="h100 | h200 | a100 | cpu (default: this machine's GPU if the run "
                                                   "would use one, else its CPU)")
    pl.add_argument("--device-memory", type=float, default=None, metavar="GB",
                    help="the device's memory in GB (default: the device's own)")
    pl.add_argument("--world-size", type=int, default=1, metavar="N", help="torchrun processes (default 1)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")

    sub.add_parser("presets", help="list the named presets")
    from ..trl.scripts import SCRIPTS  # cheap: imports nothing of TRL's until a script runs

    r = sub.add_parser("trl", add_help=False, help="run TRL's own training script on lmrl: `lmrl trl grpo ARGS` "
                                                   "takes `trl grpo ARGS` unchanged (TRL's --help lists them)")
    r.add_argument("script", choices=SCRIPTS)
    r.add_argument("script_args", nargs=argparse.REMAINDER)
    from ..log.plot import add_parser as add_plot_parser  # cheap: matplotlib loads only when plotting
    from ..tasks.prepare_data import add_parser as add_prepare_data_parser

    add_plot_parser(sub)
    add_prepare_data_parser(sub)
    return p


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = _parser(key_reference=argv[:1] == ["train"] and bool({"-h", "--help"} & set(argv)))
    # Overrides may come before or after flags (`train adder --debug train.steps=5`).
    args, extra = parser.parse_known_args(argv)
    unknown = [e for e in extra
               if args.command not in ("train", "config", "plan") or e.startswith("-") or "=" not in e]
    if unknown:
        # `--n_samples_per_prompt=8`: an OpenRLHF flag, or any key, written as a flag
        flags = [e[2:] for e in unknown if e.startswith("--") and "=" in e]
        hint = (f" (overrides are written without '--': {' '.join(flags)})"
                if flags and args.command in ("train", "config", "plan") else "")
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    if extra:
        args.overrides = list(args.overrides) + extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else list(argv))
    from ..config import ConfigError
    from ..common.data import DataError
    from ..common.errors import MissingPackage
    from ..checkpoint import CheckpointError
    from ..train.inspect import PromptError
    from ..common.errors import TrainingError
    from ..tasks.rewards import RewardError

    try:
        commands = {"train": _train, "config": _config, "eval": _eval, "generate": _generate, "export": _export,
                    "data": _data, "presets": _presets, "plot": _plot, "prepare-data": _prepare_data,
                    "trl": _trl, "plan": _plan}
        return commands[args.command](args)
    except (ConfigError, PromptError, TrainingError, RewardError, DataError, CheckpointError, FileNotFoundError,
            NotADirectoryError, PermissionError, MissingPackage) as e:
        print(f"lmrl {args.command}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1


def _trl(args) -> int:
    from ..trl.scripts import run_script

    run_script(args.script, args.script_args)
    return 0


def _source_and_overrides(args) -> tuple[str | None, list[str]]:
    """The preset or YAML path (positional or --config / --config_name) and the key=value overrides."""
    from ..config import ConfigError

    source, overrides = args.config, list(args.overrides)
    if source is not None and "=" in source:  # `lmrl train key=value ...`: overrides on the default preset
        source, overrides = None, [source, *overrides]
    option = getattr(args, "config_option", None)
    if option is not None:
        if source is not None:
            raise ConfigError(f"the config is named twice: {source!r} and --config {option!r}; give one")
        source = option
    return source, overrides


def _train_config(args):
    """The Config `lmrl train` trains, its flags and TRL's names applied."""
    from ..config import debug_overrides, load_config

    source, overrides = _source_and_overrides(args)
    source = source or "adder"
    # each flag is the override it stands for, after the key=value ones
    if args.resume:
        overrides.append("run.resume=auto")
    if args.resume_from_checkpoint is not None:
        overrides += ["run.resume=auto", f"run.resume_from={args.resume_from_checkpoint}"]
    if args.no_wandb:
        overrides.append("run.wandb=false")
    if args.algorithm is not None:
        overrides.append(f"algo.name={args.algorithm}")
    if args.device is not None:
        overrides.append(f"run.device={args.device}")
    cfg = load_config(source, overrides)
    if args.debug:  # the preset shrunk; what the command line set explicitly still wins
        cfg = load_config(source, debug_overrides(cfg) + overrides)
    if args.debug and not any(o.startswith(("run.name=", "run.dir=")) for o in args.overrides):
        cfg.run.name += "-debug"
    return cfg


def _train(args) -> int:
    from ..config import ConfigError
    from ..parallel.ddp import shutdown
    from ..train.trainers import build_trainer

    cfg = _train_config(args)
    for note in cfg.aliases:
        print(f"lmrl train: {note}", file=sys.stderr)
    if cfg.run.wandb and importlib.util.find_spec("wandb") is None:  # say so before any training
        from ..log.sinks import WANDB_MISSING

        raise ConfigError(WANDB_MISSING)
    try:
        if cfg.distributed.backend == "ray":  # the learner in a Ray actor, rollout workers beside it
            from .ray_launch import train_with_ray

            summary = train_with_ray(cfg)
        else:
            summary = build_trainer(cfg).train()
    finally:
        shutdown()  # leaves the torchrun process group, if there is one
    if not summary.get("interrupted"):
        return 0
    # a shell's code for a process ended by the signal: 130 for Ctrl-C (SIGINT), 143 for SIGTERM
    return 128 + signal.Signals[summary.get("signal") or "SIGINT"].value


def _config(args) -> int:
    from ..config import describe_config, load_config

    source, overrides = _source_and_overrides(args)
    cfg = load_config(source, overrides)
    for note in cfg.aliases:
        print(f"lmrl config: {note}", file=sys.stderr)
    print(describe_config(cfg), end="")
    return 0


# `lmrl eval` options that need a TEST_FILE, and their evaluate_file keywords
_FILE_OPTIONS = ("limit", "max_new_tokens", "batch_size", "out", "chat", "system_prompt", "prompt_template",
                 "prompt_key", "label_key", "require_format", "temperature", "seed", "device", "adapter")


def _eval(args) -> int:
    from ..config import ConfigError

    given = [name for name in _FILE_OPTIONS if getattr(args, name) is not None]
    if args.test_file is None:
        if given:
            raise ConfigError(f"--{given[0].replace('_', '-')} needs a TEST_FILE (lmrl eval RUN_DIR|MODEL FILE); "
                              f"a run's held-out set takes --size and --checkpoint only")
        if not (Path(args.source) / "config.yaml").exists():
            raise FileNotFoundError(f"{args.source} is not a run dir (no config.yaml); to evaluate a model, name a "
                                    f"JSONL test file: lmrl eval MODEL FILE")
        if args.size is not None and args.size < 1:
            raise ConfigError(f"--size must be at least 1, got {args.size}")
        from ..train.inspect import load_run

        run = load_run(args.source, args.checkpoint)
        print(json.dumps(run.evaluate(args.size), indent=2))
        return 0
    if args.size is not None:
        raise ConfigError("--size is the size of a run's held-out set; with a TEST_FILE use --limit N")
    from ..train.file_eval import default_completions_path, evaluate_file

    options = {name: getattr(args, name) for name in given}
    options.setdefault("out", default_completions_path(args.source, args.test_file))
    result = evaluate_file(args.source, args.test_file, checkpoint=args.checkpoint, **options)
    print(json.dumps(result.as_dict(), indent=2))
    return 0


def _generate(args) -> int:
    from ..config import ConfigError
    from ..train.inspect import load_run

    if not (math.isfinite(args.temperature) and args.temperature >= 0):  # before the model loads
        raise ConfigError(f"--temperature must be a finite number >= 0 (0: greedy), got {args.temperature}")
    run = load_run(args.run_dir, args.checkpoint)
    for prompt, completion, answer in run.generate(args.prompts, temperature=args.temperature):
        print(f"{prompt}{completion}    (answer {answer})")
    return 0


def _export(args) -> int:
    from ..train.inspect import export_run

    out = export_run(args.run_dir, args.out, args.checkpoint)
    print(f"exported to {out}")
    return 0


def _plot(args) -> int:
    from ..log.plot import run

    return run(args)


def _prepare_data(args) -> int:
    from ..tasks.prepare_data import run

    return run(args)


def _data(args) -> int:
    from ..tasks.registry import GENERATORS

    gen = GENERATORS[args.kind]
    config = None
    if gen.preset or args.config:  # a kind that plays in a config's sections gets one
        from ..config import load_config

        config = load_config(args.config or gen.preset)
    given = {k: getattr(args, k) for k in gen.options if getattr(args, k, None) is not None}
    out = gen.write(args.out_dir, args.train or gen.sizes[0], args.test or gen.sizes[1], seed=args.seed,
                    config=config, **given)
    stats = f": {out[2]}" if len(out) > 2 else ""
    print(f"wrote {out[0]} and {out[1]}{stats}")
    return 0


def _plan(args) -> int:
    from ..config import load_config
    from ..train.plan import plan

    source, overrides = _source_and_overrides(args)
    cfg = load_config(source or "adder", overrides)
    result = plan(cfg, device=args.device, device_memory_gb=args.device_memory, world_size=args.world_size)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.table())
    return 0 if result.fits is not False else 3


def _presets(args) -> int:
    from ..config import list_presets

    print("\n".join(list_presets()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
