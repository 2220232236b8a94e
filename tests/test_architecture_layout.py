"""docs/architecture.md's package layout names every file under lmrl/ and nothing that is not there.

The layout is the first code block under "## Package layout": a line at the left margin names a
folder (`engines/`) or a top-level module (`checkpoint.py`); an indented line's first word names a
file or a subfolder inside the folder above it. A subfolder stands for everything under it; a
package's `__init__.py` must be listed once it holds code (40 lines or more)."""

from pathlib import Path

import lmrl

PACKAGE = Path(lmrl.__file__).parent
DOC = PACKAGE.parent / "docs" / "architecture.md"


def documented(text: str) -> set[str]:
    """The paths under lmrl/ the layout block names (folders end with '/')."""
    section = text.split("## Package layout", 1)[1]
    block = section.split("```", 2)[1]
    paths, folder = set(), ""
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        word = line.split()[0]
        if not line.startswith(" "):
            folder = word if word.endswith("/") else ""
            paths.add(word)
        elif line.startswith("  ") and not line.startswith("   ") and folder:
            paths.add(folder + word)
    return paths


def actual() -> tuple[set[str], set[str]]:
    """(files that must be listed, files that may be)."""
    must, may = set(), set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and len(path.read_text().splitlines()) < 40:
            may.add(rel)
        elif rel != "__main__.py" and rel != "__init__.py":
            must.add(rel)
    return must, may


def test_the_layout_lists_every_file_and_only_files_that_exist():
    paths = documented(DOC.read_text())
    folders = {p for p in paths if p.endswith("/")}
    files = paths - folders
    must, may = actual()
    covered = {f for f in must if any(f.startswith(d) for d in folders if d.count("/") > 1)}
    missing = sorted(must - files - covered)
    assert not missing, "files under lmrl/ the layout in docs/architecture.md does not list: " + ", ".join(missing)
    stale = sorted(f for f in files if not (PACKAGE / f).is_file())
    stale += sorted(d for d in folders if not (PACKAGE / d).is_dir())
    assert not stale, "the layout in docs/architecture.md lists what lmrl/ does not hold: " + ", ".join(stale)


def test_the_reader_finds_folders_files_and_subfolders():
    text = ("## Package layout\n\nintro\n\n```\nengines/   what samples\n  local.py   engines\n"
            "                      continued text.py\n  sub/    a subfolder\ncheckpoint.py  top level\n```\n")
    assert documented(text) == {"engines/", "engines/local.py", "engines/sub/", "checkpoint.py"}
