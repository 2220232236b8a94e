"""The package's layers import downward only, and no modules import each other in a cycle.

Read from the source with `ast` (nothing is imported), every import counted, top-level or inside
a function, `importlib.import_module("lmrl....")` too: a lazy import is still a dependency."""

import ast
from pathlib import Path

import lmrl

PACKAGE = Path(lmrl.__file__).parent

# Lowest first: one line per layer, each naming whole folders (a top-level module is its own folder).
# A module may import its own layer and the layers listed before it, never one listed after.
LAYERS = [
    ["lmrl.common"],
    ["lmrl.envs", "lmrl.log", "lmrl.parallel"],
    ["lmrl.generation"],
    ["lmrl.algos", "lmrl.models"],
    ["lmrl.checkpoint", "lmrl.tasks"],
    ["lmrl.engines"],
    ["lmrl.config"],
    ["lmrl.train"],
    ["lmrl.cli", "lmrl.trl", "lmrl.__main__", "lmrl"],
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    best, found = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    assert found is not None, f"{module} is in no layer: add it to LAYERS"
    return found


def imports_of(module: str, source: str | None = None) -> set[str]:
    """The lmrl modules `module` imports (a name imported from a package counts as its submodule
    when there is one); `source` stands in for the module's file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "lmrl"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "lmrl":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Call) and _called_name(node.func) == "import_module" and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                dots = len(name.value) - len(name.value.lstrip("."))
                base = package.split(".")[: len(package.split(".")) - (dots - 1)] if dots else []
                found.add(".".join(base + [name.value.lstrip(".")]).rstrip("."))
            else:
                assert _names_its_own_package(name), (
                    f"{module}:{node.lineno}: import_module of a computed name outside its own package "
                    "cannot be placed in a layer: write the module's name out")
    found.discard(module)
    return {m for m in found if m in MODULES}


def _called_name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _names_its_own_package(name) -> bool:
    """A computed module name inside the caller's own package (it starts with `__name__`,
    `__package__` or one dot), or a user's module given at run time (a plain variable): neither
    reaches another layer of lmrl."""
    if isinstance(name, ast.JoinedStr) and name.values:
        first = name.values[0]
        if isinstance(first, ast.Constant):
            return first.value.startswith(".") and not first.value.startswith("..")
        return isinstance(first, ast.FormattedValue) and getattr(first.value, "id", "") in ("__name__", "__package__")
    return isinstance(name, ast.Name)


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_import_goes_to_the_same_or_a_lower_layer():
    upward = [f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
              for m, targets in sorted(GRAPH.items()) for t in sorted(targets) if layer_of(t) > layer_of(m)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_cycle():
    cycles, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for t in sorted(GRAPH[m]):
            if t == "lmrl" or m == "lmrl":  # the package's own lazy re-exports sit on top of everything
                continue
            if state.get(t) == "open":
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_layer_table_names_only_existing_modules():
    for prefixes in LAYERS:
        for prefix in prefixes:
            assert any(m == prefix or m.startswith(prefix + ".") for m in MODULES), prefix



def test_each_layer_names_whole_folders_and_each_folder_is_in_one_layer():
    named = [prefix for prefixes in LAYERS for prefix in prefixes]
    assert all(p == "lmrl" or p.count(".") == 1 for p in named), "a layer names part of a folder"
    top = {m if m == "lmrl" else ".".join(m.split(".")[:2]) for m in MODULES}
    assert sorted(named) == sorted(top), "each top-level folder or module of lmrl in exactly one layer"



def test_import_module_calls_count_as_imports():
    source = "import importlib\n\ndef f():\n    return importlib.import_module('lmrl.train.trainers')\n"
    assert imports_of("lmrl.parallel.ddp", source) == {"lmrl.train.trainers"}
