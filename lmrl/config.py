"""Configuration: one dataclass per section, YAML presets, `a.b=c` overrides, validation.

    cfg = load_config("adder", ["train.steps=50", "optim.lr=3e-4"])
    cfg = AdderRLConfig()            # the same preset, by its class-style name

A preset is `lmrl/configs/<name>.yaml` (the repo's `configs/` links there). A YAML file may start
from another preset with `base: <name>`. Every error names the key and where it came from, and
suggests the nearest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml

from .config_schema import (  # noqa: F401  (re-exported: `from lmrl.config import TrainConfig`)
    PRESET_DIR, PRESET_ALIASES, TRAINERS, ConfigError, arithmetic_seq_len, suggest,
    RunConfig, ModelConfig, TaskConfig, EnvConfig, LoraConfig, RewardConfig,
    SFTConfig, DataConfig, DPOConfig, AlgoConfig, OptimConfig, ScheduleConfig,
    TrainConfig, EvalConfig, RolloutConfig, DistributedConfig, Config,
)
from .tasks.arithmetic import OPS as ARITHMETIC_TASKS


# -- loading -------------------------------------------------------------------------------------
def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _preset_path(source: str | Path) -> Path:
    source = str(source)
    source = PRESET_ALIASES.get(source, source)
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        return path
    if (PRESET_DIR / f"{source}.yaml").exists():
        return PRESET_DIR / f"{source}.yaml"
    names = list_presets() + list(PRESET_ALIASES)
    near = difflib.get_close_matches(source, names, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ConfigError(f"unknown preset {source!r}{hint} (available: {', '.join(list_presets())})")


class _DuplicateKey(Exception):
    def __init__(self, key, line: int, first: int):
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping holding a key twice is an error (PyYAML keeps
    the last value without a word, so a repeated section or key would silently drop the first)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, it repeats nothing
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise _DuplicateKey(key, line, first_line[key])
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path, seen: tuple = ()) -> list[tuple[dict, str]]:
    """The layers of a YAML config, base presets first, each with its file name for errors."""
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'base' presets form a cycle")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text ({e.reason} at byte {e.start} of the file)") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except _DuplicateKey as e:
        raise ConfigError(f"{path}:{e.line}: key {e.key!r} appears twice in one mapping (first on line {e.first}); "
                          f"YAML would keep only the last") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    layers = []
    if "base" in data:
        layers = _read_yaml(_preset_path(data.pop("base")), seen + (path.resolve(),))
    return layers + [(data, str(path))]


def load_config(source: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """A validated Config from a preset name / alias / YAML path (None = defaults) plus overrides."""
    cfg = Config()
    set_in: dict[str, int] = {}  # dotted key -> the last layer (base presets first, overrides last) setting it
    layers = _read_yaml(_preset_path(source)) if source is not None else []
    for i, (data, where) in enumerate(layers):
        set_in.update(dict.fromkeys(_apply_mapping(cfg, data, where), i))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        _set(cfg, key.strip(), _override_value(raw), f"override {item}")
        set_in[key.strip()] = len(layers)
    # An offline config built on an RL preset (base: sql-agent-smollm2, run.trainer: sft) inherits its
    # train.steps, RL updates that mean nothing to an offline trainer (and an RL config on an offline
    # base its train.max_steps): back to the default, so that validation refuses only the other kind's
    # step count set with or after the trainer.
    other = "steps" if cfg.run.trainer != "rl" else "max_steps"
    if set_in.get(f"train.{other}", -1) < set_in.get("run.trainer", -1):
        setattr(cfg.train, other, getattr(TrainConfig, other))
    validate(cfg)
    return cfg


def debug_overrides(cfg: Config) -> list[str]:
    """Overrides that shrink `cfg` to a run of seconds after the model loads (`lmrl train --debug`):
    fewer and smaller steps, a few held-out rows, short completions; every stage the config has,
    and no stage it lacks. Data files are left as they are (a generated set is the real run's too)."""
    t, out = cfg.train, ["train.log_every=1", "train.eval_every=2", "train.ckpt_every=2"]
    if cfg.run.trainer != "rl":
        per_step = t.ga_steps * max(1, 4 // t.ga_steps)  # rows per optimizer step, whole micro-batches
        out += [f"train.max_steps={min(t.max_steps or 4, 4)}", f"data.batch_size={min(cfg.data.batch_size, per_step)}",
                f"data.eval_size={min(cfg.data.eval_size or 4, 4)}"]
        return out
    if cfg.sft.steps:
        out += [f"sft.steps={min(cfg.sft.steps, 4)}", f"sft.examples={min(cfg.sft.examples, 64)}",
                f"sft.batch_size={min(cfg.sft.batch_size, 32)}"]
    text = cfg.task.name not in ARITHMETIC_TASKS
    group = cfg.algo.group_size * t.ga_steps  # a rollout holds whole groups, split into whole micro-batches
    rollout = group * max(1, (4 if text else 32) // group)
    eval_size = min(cfg.eval.size, 4 if text else 64)
    out += [f"train.steps={min(t.steps, 4)}", f"train.rollout_size={min(t.rollout_size, rollout)}",
            f"eval.size={eval_size}", f"eval.batch_size={min(cfg.eval.batch_size, eval_size)}"]
    if text:
        out.append(f"task.max_new_tokens={min(cfg.task.max_new_tokens, 32)}")
    if cfg.task.name == "sql":
        out.append(f"env.max_rounds={min(cfg.env.max_rounds, 2)}")
    return out


def validate(cfg: Config) -> None:
    """Raises a ConfigError with the config's first problem (see `lmrl.config_schema`), or returns."""
    problems = cfg.problems()
    if problems:
        raise ConfigError(problems[0])


def _override_value(raw: str):
    """A command-line value read as YAML (3e-4, true, [a, b]); text that is not valid YAML, or that
    YAML reads as a mapping (`{prompt} ...`), stays the string it was typed as."""
    if not raw.strip():
        return ""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return raw if isinstance(value, dict) else value


def config_from_dict(data: dict, where: str = "<dict>") -> Config:
    cfg = Config()
    _apply_mapping(cfg, data, where)
    validate(cfg)
    return cfg


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """Writes the resolved config as YAML, atomically (temp file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    os.replace(tmp, path)


def _apply_mapping(cfg: Config, data: dict, where: str) -> list[str]:
    """Sets each section.key of `data`; returns the dotted keys set."""
    done = []
    for section, values in data.items():
        if not isinstance(values, dict):
            _set(cfg, str(section), values, where)  # reports an unknown section or a bare key
            continue
        for key, value in values.items():
            _set(cfg, f"{section}.{key}", value, where)
            done.append(f"{section}.{key}")
    return done


def _set(cfg: Config, dotted: str, value: Any, where: str) -> None:
    section, _, key = dotted.partition(".")
    sections = [f.name for f in dataclasses.fields(Config)]
    if section not in sections:
        raise ConfigError(f"unknown section {section!r} in {where}{suggest(section, sections)}")
    sub = getattr(cfg, section)
    keys = [f.name for f in dataclasses.fields(sub)]
    if not key:
        raise ConfigError(f"{where}: {section!r} is a section; set a key such as {section}.{keys[0]}")
    if key not in keys:
        full = [f"{s}.{f.name}" for s in sections for f in dataclasses.fields(getattr(cfg, s))]
        raise ConfigError(f"unknown key {dotted!r} in {where}{suggest(dotted, full)}")
    ftype = typing.get_type_hints(type(sub))[key]
    setattr(sub, key, _coerce(value, ftype, dotted, where))


def _coerce(value: Any, ftype, key: str, where: str):
    """Checks a YAML value against the field's type; ints widen to float, '1e-4' becomes 1e-4."""
    optional = isinstance(ftype, types.UnionType) and type(None) in ftype.__args__
    if optional:
        if value is None:
            return None
        ftype = next(a for a in ftype.__args__ if a is not type(None))
    bad = ConfigError(f"{key} must be {_type_name(ftype)}, got {value!r} (from {where})")
    if ftype is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if ftype is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if ftype is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if ftype is str:
        if not isinstance(value, str):
            raise bad
        return value
    if ftype is list:
        if not isinstance(value, list):
            raise bad
        return value
    return value


def _type_name(t) -> str:
    return {bool: "true or false", int: "an int", float: "a number", str: "a string", list: "a list"}.get(t, str(t))


# -- presets by class-style name -----------------------------------------------------------------
def AdderRLConfig(*overrides: str) -> Config:
    """The `adder` preset: 4 layers, 8 heads, 256 dims, 3-digit addition."""
    return load_config("adder", overrides)


def MultiplierRLConfig(*overrides: str) -> Config:
    """The `multiplier` preset: 6 layers, 8 heads, 256 dims, 2-digit multiplication."""
    return load_config("multiplier", overrides)

