"""Configuration: one dataclass per section, YAML presets, `a.b=c` overrides, validation.

    cfg = load_config("adder", ["train.steps=50", "optim.lr=3e-4"])
    cfg = AdderRLConfig()            # the same preset, by its class-style name

A preset is `lmrl/config/presets/<name>.yaml` (the repo's `configs/` links there). A YAML file may start
from another preset with `base: <name>`. Every error names the key and where it came from, and
suggests the nearest valid key.

TRL's, verl's and OpenRLHF's names are accepted too (`num_generations=8`, `actor_rollout_ref.rollout.n=8`
and `n_samples_per_prompt=8` set algo.group_size; the tables are in `lmrl.config.aliases`); `load_config`
leaves one line per name it translated on `cfg.aliases` and prints nothing, and refuses in one line a
name lmrl does not take as it is. `describe_config` lists every key with its value and help text
(`lmrl config PRESET`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml

from .schema import (  # noqa: F401  (re-exported: `from lmrl.config import TrainConfig`)
    PRESET_DIR, PRESET_ALIASES, TRAINERS, WARMUP_KEYS, ConfigError, arithmetic_seq_len, suggest, unread_key_problem,
    unread_keys, _bounds_text,
    RunConfig, ModelConfig, TaskConfig, EnvConfig, LoraConfig, RewardConfig,
    SFTConfig, DataConfig, DPOConfig, AlgoConfig, OptimConfig, ScheduleConfig,
    TrainConfig, EvalConfig, RolloutConfig, DistributedConfig, Config,
)
from .aliases import (  # noqa: F401  (re-exported)
    OPENRLHF_ALIASES, SPELLINGS as _ALIAS_SPELLINGS, TRL_ALIASES, VERL_ALIASES, Alias, all_keys as _all_keys,
    spelling as _spelling, suggest_key as _suggest, foreign_section_problem, translate as _translate,
)
from ..tasks import task_spec


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


def _key_lines(text: str) -> dict[str, int]:
    """The line of each name in a YAML config's text (already read without error), top-level and
    dotted (`section.key`, verl's `actor_rollout_ref.rollout.n`), for errors that name where a key was set."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    lines: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                lines[prefix + key.value] = key.start_mark.line + 1
                if isinstance(value, yaml.MappingNode):
                    walk(value, f"{prefix}{key.value}.")

    if isinstance(root, yaml.MappingNode):
        walk(root, "")
    return lines


def _read_yaml(path: Path, seen: tuple = ()) -> list[tuple[dict, str, dict[str, int]]]:
    """The layers of a YAML config, base presets first, each with its file name and its keys' lines
    for errors."""
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
    lines = _key_lines(text)
    layers = []
    if "base" in data:
        try:
            base = _preset_path(data.pop("base"))
        except ConfigError as e:
            raise ConfigError(f"{path}:{lines.get('base', '?')}: base: {e}") from None
        layers = _read_yaml(base, seen + (path.resolve(),))
    return layers + [(data, str(path), lines)]


def load_config(source: str | Path | None = None, overrides: Sequence[str] = (), *, saved_run: bool = False) -> Config:
    """A validated Config from a preset name / alias / YAML path (None = defaults) plus overrides.
    `saved_run`: `source` is the config.yaml a run wrote, whose keys its run never read (an older lmrl
    wrote them as set) go back to their defaults rather than being refused."""
    cfg = Config()
    set_in: dict[str, int] = {}  # dotted key -> the last layer (base presets first, overrides last) setting it
    origin: dict[str, str | None] = {}  # dotted key -> the file:line that set it last (None: an override)
    notes: list[str] = []  # one per TRL name translated
    layers = _read_yaml(_preset_path(source)) if source is not None else []
    for i, (data, where, lines) in enumerate(layers):
        for key, line_where in _apply_items(cfg, _items_of(data, where, lines), notes):
            set_in[key], origin[key] = i, line_where
    items = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        items.append((key.strip(), _override_value(raw), f"override {item}"))
    for key, _ in _apply_items(cfg, items, notes):
        set_in[key], origin[key] = len(layers), None  # typed on the command line, in sight of its error
    # An offline config built on an RL preset (base: sql-agent-smollm2, run.trainer: sft) inherits its
    # train.steps and warm-up keys, which mean nothing to an offline trainer (and an RL config on an
    # offline base its train.max_steps and data section); a layer that skips the warm-up (sft.steps=0 on
    # the adder) leaves the preset's warm-up keys behind. Each goes back to its default, so that
    # validation refuses only such a key set with or after the layer that made it unread.
    other = "steps" if cfg.run.trainer != "rl" else "max_steps"
    for key in [f"train.{other}", *unread_keys(cfg)]:
        since = set_in.get("run.trainer", -1)
        if cfg.run.trainer == "rl" and key in WARMUP_KEYS:
            since = max(since, set_in.get("sft.steps", -1))
        if saved_run or set_in.get(key, -1) < since:
            section, _, name = key.partition(".")
            sub = getattr(cfg, section)
            setattr(sub, name, getattr(type(sub)(), name))
            origin.pop(key, None)
    try:
        validate(cfg)
        unread = unread_key_problem(cfg)  # a key set in a file or override that the run would ignore
        if unread:
            raise ConfigError(unread)
    except ConfigError as e:
        raise ConfigError(_with_source(str(e), origin)) from None
    cfg.aliases = tuple(notes)
    return cfg


def _with_source(problem: str, origin: dict[str, str | None]) -> str:
    """A validation `problem` with the file and line that set each key it names, where a file did. A
    problem whose first key was set on the command line (in sight already), or that says where its
    value came from, is left as it is."""
    keys = list(dict.fromkeys(re.findall(r"\b[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*\b", problem)))
    named = [k for k in keys if k in origin]  # the keys it names that a file or the command line set
    if "(from " in problem or not named or origin[named[0]] is None:
        return problem
    files = [(k, origin[k]) for k in named if origin[k] is not None]
    if len(files) == 1 and files[0][0] == keys[0]:
        return f"{problem} (from {files[0][1]})"
    return f"{problem} ({', '.join(f'{k} from {where}' for k, where in files)})"


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
    spec = task_spec(cfg.task.name)
    text = spec.model == "hf"
    group = cfg.algo.group_size * t.ga_steps  # a rollout holds whole groups, split into whole micro-batches
    rollout = group * max(1, (4 if text else 32) // group)
    eval_size = min(cfg.eval.size, 4 if text else 64)
    out += [f"train.steps={min(t.steps, 4)}", f"train.rollout_size={min(t.rollout_size, rollout)}",
            f"eval.size={eval_size}", f"eval.batch_size={min(cfg.eval.batch_size, eval_size)}"]
    if text:
        out.append(f"task.max_new_tokens={min(cfg.task.max_new_tokens, 32)}")
    return out + spec.debug_overrides(cfg)  # the task's own shrinking comes last, so it wins


def validate(cfg: Config) -> None:
    """Raises a ConfigError with the config's first problem (see `lmrl.config.schema`), or returns."""
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
    cfg, notes = Config(), []
    _apply_items(cfg, _items_of(data, where), notes)
    validate(cfg)
    cfg.aliases = tuple(notes)
    return cfg


def describe_config(cfg: Config | None = None) -> str:
    """Every key of `cfg` (default: the defaults) as YAML, each with its value, then its help text and
    bounds as a comment; TRL's names follow as comments, and where verl's and OpenRLHF's are listed. The text
    loads back as the same config."""
    cfg = cfg or Config()
    lines = []
    for section in dataclasses.fields(cfg):
        lines.append(f"{section.name}:")
        sub = getattr(cfg, section.name)
        for f in dataclasses.fields(sub):
            value = yaml.safe_dump([getattr(sub, f.name)], default_flow_style=True, width=10**9).strip()[1:-1]
            meta = f.metadata
            bounds = _bounds_text(meta) if any(meta[k] is not None for k in ("ge", "gt", "le", "lt")) else ""
            bounds = f" ({bounds})" if bounds and bounds not in meta["help"] else ""
            lines.append(f"  {f'{f.name}: {value}':<34} # {meta['help']}{bounds}")
    lines.append("# TRL's names, accepted for the key each sets: written bare, under that key's section, or under")
    lines.append("# algo (GRPOConfig) / dpo (DPOConfig) / either (TrainingArguments):")
    for name, alias in TRL_ALIASES.items():
        target = f"-> {alias.key}" + (f" (and {alias.also}, unless the same file or command line sets it)"
                                      if alias.also else "")
        if alias.values is not None:
            target += " with " + ", ".join(f"{yaml.safe_dump(k).split(chr(10))[0]}={v}"
                                           for k, v in alias.values.items() if k != v)
        if alias.key is None:
            target = f"-> no single key: {alias.note}"
        elif alias.note:
            target += f"; {alias.note}"
        lines.append(f"#   {name:<29} {alias.source:<18} {target}")
    lines.append("# verl's names (actor_rollout_ref.rollout.n=8, ...), OpenRLHF's flags (n_samples_per_prompt=8, ...):")
    lines.append("# docs/from-verl-openrlhf.md")
    return "\n".join(lines) + "\n"


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


def _items_of(data: dict, where: str, lines: dict[str, int] | None = None) -> list[tuple[str, Any, str]]:
    """A YAML mapping of sections as (dotted key, value, where) items, `where` with the key's line
    when `lines` has it; a top-level entry that is not a mapping or is another tool's name
    (`num_generations: 8`, `chat_template_kwargs: {enable_thinking: false}`) stays bare, for `_set` to
    translate or refuse, and a section that is not lmrl's (verl's `actor_rollout_ref: {rollout: {n: 8}}`)
    becomes its dotted names."""
    lines = lines or {}
    sections = {f.name for f in dataclasses.fields(Config)}

    def at(key: str) -> str:
        return f"{where}:{lines[key]}" if key in lines else where

    def flat(prefix: str, values: dict) -> list[tuple[str, Any, str]]:
        out = []
        for key, value in values.items():
            dotted = f"{prefix}.{key}"
            deeper = isinstance(value, dict) and dotted not in _ALIAS_SPELLINGS
            out += flat(dotted, value) if deeper else [(dotted, value, at(dotted))]
        return out

    items, keys = [], set(_all_keys())
    for section, values in data.items():
        if isinstance(values, dict) and section not in _ALIAS_SPELLINGS:
            if section in sections:  # a mapping under a name that is no key is verl's (data: {multiturn: ...})
                for key, value in values.items():
                    dotted = f"{section}.{key}"
                    deeper = isinstance(value, dict) and dotted not in keys and dotted not in _ALIAS_SPELLINGS
                    items += flat(dotted, value) if deeper else [(dotted, value, at(dotted))]
            else:
                items += flat(str(section), values)
        else:
            items.append((str(section), values, at(str(section))))
    return items


def _apply_items(cfg: Config, items: list[tuple[str, Any, str]], notes: list[str]) -> list[tuple[str, str]]:
    """Sets the items of one source (a YAML file, or the command line's overrides), other tools'
    names translated (a note each in `notes`); returns each lmrl key set with where it was set. A
    name's further keys (TRL's epsilon's upper clip, verl's gae's value model) give way to the same
    source setting them otherwise; two names that set one key to different values are refused. A name
    verl or OpenRLHF give an RL key and an offline trainer's alike (the prompt's column) sets the one of
    the run's kind as far as it is known here: the run.trainer this source sets, else the one before."""
    trainer = next((value for key, value, _ in reversed(items) if key == "run.trainer"), cfg.run.trainer)
    offline, written = trainer != "rl", {key for key, _, _ in items}
    names = {i: found for i, (key, _, _) in enumerate(items) if (found := _spelling(key, offline, written))}
    translated = {i: _translate(key, value, where, offline) for i, (key, value, where) in enumerate(items)
                  if i in names}
    firsts = {pairs[0][0] for pairs, _ in translated.values() if pairs}
    named = {key for i, (key, _, _) in enumerate(items) if i not in translated} | firsts
    by_alias: dict[str, tuple[str, Any]] = {}  # lmrl key -> (the name, as written, that set it, its value)
    done = []
    for i, (key, value, where) in enumerate(items):
        if i not in translated:
            _set(cfg, key, value, where)
            done.append((key, where))
            continue
        pairs, tail = translated[i]
        name, alias = names[i]
        sets = pairs[:1] + [(k, v) for k, v in pairs[1:] if k not in named]
        for target, v in sets:
            _set(cfg, target, v, f"{where}, as {alias.owner}'s {name}")
            done.append((target, where))
        if sets:
            first, value_set = sets[0][0], _get(cfg, sets[0][0])
            other = by_alias.setdefault(first, (key, value_set))
            if other[0] != key and other[1] != value_set:
                raise ConfigError(f"{other[0]} and {key} both set {first}, to {other[1]} and {value_set} (in "
                                  f"{where}): lmrl has one {first}; write one of them")
            targets = [t for t, _ in sets]
            values = ", ".join(f"{t}={_get(cfg, t)}" for t in targets)  # as set: '1e-3' reads as 0.001
            named_keys = " and ".join([", ".join(targets[:-1]), targets[-1]] if len(targets) > 1 else targets)
            notes.append(f"{key} is {alias.owner}'s name for {named_keys}: set {values}{tail}")
        else:
            notes.append(tail)
    return done


def _get(cfg: Config, dotted: str) -> Any:
    section, _, key = dotted.partition(".")
    return getattr(getattr(cfg, section), key)


def _set(cfg: Config, dotted: str, value: Any, where: str) -> None:
    section, _, key = dotted.partition(".")
    sections = [f.name for f in dataclasses.fields(Config)]
    if section not in sections:
        if key:
            raise ConfigError(foreign_section_problem(section, dotted, where)
                              or f"unknown section {section!r} in {where}{suggest(section, sections)}")
        alias = TRL_ALIASES.get(section)
        if alias is not None:  # `beta=0.1`: GRPOConfig's or DPOConfig's?
            raise ConfigError(f"{section!r} in {where} is ambiguous: write algo.{section} for GRPOConfig's (it sets "
                              f"{alias.key}); {alias.note}")
        owners = [k for k in _all_keys() if k.endswith(f".{section}")]
        if owners:  # `steps=5`: a key without its section
            raise ConfigError(f"unknown key {section!r} in {where}; did you mean "
                              f"{' or '.join(repr(k) for k in owners)}?")
        bare_aliases = [s for s in _ALIAS_SPELLINGS if "." not in s]
        raise ConfigError(f"unknown section or key {section!r} in {where}{_suggest(section, sections + bare_aliases)}")
    sub = getattr(cfg, section)
    keys = [f.name for f in dataclasses.fields(sub)]
    head, dot, inner = key.partition(".")
    if dot and head in keys and typing.get_type_hints(type(sub))[head] is dict:  # env.kwargs.level=2: one entry
        getattr(sub, head)[inner] = value
        return
    if not key:
        raise ConfigError(f"{where}: {section!r} is a section; set a key such as {section}.{keys[0]}")
    if key not in keys:
        rl = (" (the data section is the offline trainers' (run.trainer=sft, dpo, reward); an RL run's prompts are "
              "the task section's)") if section == "data" else ""
        raise ConfigError(f"unknown key {dotted!r} in {where}{_suggest(dotted, _all_keys() + list(_ALIAS_SPELLINGS))}"
                          f"{rl}")
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
        if isinstance(value, str):  # one item, as TRL's CLI takes it: reward.funcs=pkg.module:fn
            return [value] if value else []
        if not isinstance(value, list):
            raise bad
        return value
    if ftype is dict:
        if isinstance(value, str):  # a mapping typed on the command line: env.kwargs='{level: 2}'
            try:
                value = yaml.safe_load(value) if value.strip() else {}
            except yaml.YAMLError:
                raise bad from None
        if not isinstance(value, dict):
            raise bad
        return value
    return value


def _type_name(t) -> str:
    return {bool: "true or false", int: "an int", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(t, str(t))


# -- presets by class-style name -----------------------------------------------------------------
def AdderRLConfig(*overrides: str) -> Config:
    """The `adder` preset: 4 layers, 8 heads, 256 dims, 3-digit addition."""
    return load_config("adder", overrides)


def MultiplierRLConfig(*overrides: str) -> Config:
    """The `multiplier` preset: 6 layers, 8 heads, 256 dims, 2-digit multiplication."""
    return load_config("multiplier", overrides)

