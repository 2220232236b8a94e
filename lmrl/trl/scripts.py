"""TRL's own training scripts (`trl/scripts/{grpo,rloo,dpo,sft,reward}.py` in the installed trl) run on
lmrl: each script's `trl` imports are resolved to `lmrl.trl` as it is loaded, and nothing else of it
changes. `lmrl trl grpo ARGS` takes `trl grpo ARGS`'s command line unchanged.

    run_script("dpo", ["--model_name_or_path", "path/to/model", "--dataset_name", "data/pairs",
                       "--output_dir", "runs/dpo", "--max_steps", "50", "--use_cpu"])
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

SCRIPTS = ("grpo", "rloo", "dpo", "sft", "reward")
_TRL_IMPORT = re.compile(r"^(\s*)from trl(\.rewards)? import ", re.MULTILINE)


def script_path(name: str) -> Path:
    """Where the installed trl keeps script `name`."""
    if name not in SCRIPTS:
        raise ValueError(f"no TRL script {name!r}: lmrl runs {', '.join(SCRIPTS)}")
    spec = importlib.util.find_spec(f"trl.scripts.{name}")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the installed trl has no scripts/{name}.py (pip install 'lmrl[trl]')")
    return Path(spec.origin)


def resolve_imports(source: str) -> str:
    """A script's source with `from trl import ...` (and `from trl.rewards import ...`) made lmrl.trl's."""
    return _TRL_IMPORT.sub(lambda m: f"{m.group(1)}from lmrl.trl{m.group(2) or ''} import ", source)


def run_script(name: str, argv: list[str]) -> None:
    """Runs TRL's script `name` as `python -m trl.scripts.<name> ARGV` would, on lmrl's trainers."""
    path = script_path(name)
    code = compile(resolve_imports(path.read_text()), f"{path} (trl imports resolved to lmrl.trl)", "exec")
    saved = sys.argv
    sys.argv = [str(path), *argv]
    try:
        exec(code, {"__name__": "__main__", "__file__": str(path)})
    finally:
        sys.argv = saved
