"""No unused code: vulture over the package and the scripts that use it, as `make deadcode` runs it
(settings: pyproject.toml's [tool.vulture]; names used only by name: tests/vulture_whitelist.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_vulture_finds_no_unused_code():
    found = subprocess.run([sys.executable, "-m", "vulture"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (found.returncode, found.stdout) == (0, ""), found.stdout + found.stderr
