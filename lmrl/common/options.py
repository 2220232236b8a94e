"""Config sections as dataclasses whose fields carry their help text and the values they take.

    @dataclass
    class GuessOptions(Section):
        low: int = option(1, "smallest number the game picks", ge=0)

A field's metadata says what it takes: `choices` (a tuple, or a registry dict whose keys are the
names; for a list, what each item may be), bounds `ge`/`gt`/`le`/`lt`, and every float must be
finite. `Section.problems` checks those, then the section's own `check` (rules between its fields).
The config (`lmrl.config.schema`) is built of such sections; so are the sections a registered task
declares (`lmrl.tasks.registry`), which is why this module sits below both."""

from __future__ import annotations

import difflib
import math
import operator
from dataclasses import field, fields


def option(default, help: str, *, choices=None, ge=None, gt=None, le=None, lt=None, **kw):
    """A field with its default, help text and the values it takes: `choices` (a tuple, or a registry
    dict whose keys are the names; for a list, what each item may be) and numeric bounds."""
    meta = {"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def suggest(name: str, options) -> str:
    """The option nearest to `name` as "; did you mean 'x'?", or an empty string when none is near."""
    near = difflib.get_close_matches(name, [str(o) for o in options], n=1, cutoff=0.5)
    return f"; did you mean {near[0]!r}?" if near else ""


def _bounds_text(meta) -> str:
    low = f"[{meta['ge']}" if meta["ge"] is not None else f"({meta['gt']}" if meta["gt"] is not None else None
    high = f"{meta['le']}]" if meta["le"] is not None else f"{meta['lt']})" if meta["lt"] is not None else None
    if low and high:
        return f"in {low}, {high}"
    if low:
        return f">= {low[1:]}" if low[0] == "[" else f"> {low[1:]}"
    return f"<= {high[:-1]}" if high[-1] == "]" else f"< {high[:-1]}"


_BOUNDS = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}


def _field_problem(key: str, value, meta) -> str | None:
    """What is wrong with one field's value by its metadata, or None."""
    choices = meta["choices"]
    if choices is not None:
        for item in value if isinstance(value, list) else [value]:
            if item not in choices:
                names = [str(c) if c else "'' (empty)" for c in choices]
                return f"{key}={item!r} is not one of {', '.join(names)}{suggest(str(item), choices)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key} must be a finite number, got {value}"
    if any(meta[k] is not None and not within(value, meta[k]) for k, within in _BOUNDS.items()):
        return f"{key} must be {_bounds_text(meta)}, got {value}"
    return None


class Section:
    """What every section shares: its problems are its fields' (by their metadata), then `check`'s."""

    def problems(self, name: str) -> list[str]:
        """One line per problem, each naming `name.key`; `check` runs only on fields that passed."""
        found = [problem for f in fields(self)
                 if (problem := _field_problem(f"{name}.{f.name}", getattr(self, f.name), f.metadata))]
        return found or self.check()

    def check(self) -> list[str]:
        """Rules between this section's own fields (none by default)."""
        return []


