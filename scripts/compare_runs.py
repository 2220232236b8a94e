"""Are two run directories the same run? For a change that must not change what the code computes
(a refactoring): the same command run before and after it should give equal metrics and equal weights.

    python scripts/compare_runs.py /tmp/before/adder /tmp/after/adder

Compares metrics.jsonl row by row without the fields that measure time (`time/*`, `perf/*`), and
every *.safetensors file under the two directories byte for byte (SHA-256). Prints one line per
difference and exits 1 if there is any, 0 if the runs agree."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

TIMING_PREFIXES = ("time/", "perf/")


def metric_rows(run: Path) -> list[dict]:
    rows = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)})
    return rows


def weight_hashes(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*.safetensors"))}


def differences(a: Path, b: Path) -> list[str]:
    """One line per difference between run dirs `a` and `b`; empty when they agree."""
    found = []
    rows_a, rows_b = metric_rows(a), metric_rows(b)
    if len(rows_a) != len(rows_b):
        found.append(f"metrics.jsonl: {len(rows_a)} rows against {len(rows_b)}")
    for i, (x, y) in enumerate(zip(rows_a, rows_b), 1):
        keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
        if keys:
            found.append(f"metrics.jsonl row {i}: " + ", ".join(f"{k} {x.get(k)!r} != {y.get(k)!r}" for k in keys))
    hashes_a, hashes_b = weight_hashes(a), weight_hashes(b)
    for name in sorted(hashes_a.keys() | hashes_b.keys()):
        if hashes_a.get(name) != hashes_b.get(name):
            found.append(f"{name}: " + ("missing in one run" if name not in hashes_a or name not in hashes_b
                                        else "bytes differ"))
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    args = p.parse_args(argv)
    found = differences(args.run_a, args.run_b)
    for line in found:
        print(line)
    rows, files = len(metric_rows(args.run_a)), len(weight_hashes(args.run_a))
    print(f"{'differ' if found else 'same'}: {rows} metrics rows (time/ and perf/ left out), {files} safetensors files")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
