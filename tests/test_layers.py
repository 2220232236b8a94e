"""The package's layers import downward only, and no modules import each other in a cycle.

Read from the source with `ast` (nothing is imported), every import counted, top-level or inside
a function: a lazy import is still a dependency."""

import ast
from pathlib import Path

import lmrl

PACKAGE = Path(lmrl.__file__).parent

# Lowest first. A module belongs to the longest prefix that names it; a module may import its own
# layer and the layers listed before it, never one listed after.
LAYERS = [
    ["lmrl.errors", "lmrl.data", "lmrl.options"],
    ["lmrl.distributed.ddp", "lmrl.distributed.fsdp", "lmrl.algos", "lmrl.log", "lmrl.schedules"],
    ["lmrl.rollout.local", "lmrl.rollout.hf_generate", "lmrl.rollout.kv_cache", "lmrl.rollout.packed_linear",
     "lmrl.rollout.agent", "lmrl.rollout.sampling", "lmrl.envs"],
    ["lmrl.models", "lmrl.checkpoint"],
    ["lmrl.tasks"],
    ["lmrl.rollout.engine", "lmrl.rollout.vllm_engine", "lmrl.distributed.ray_engine", "lmrl.distributed.ray_cluster"],
    ["lmrl.rollout.engines"],
    ["lmrl.config", "lmrl.config_schema"],
    ["lmrl.train", "lmrl.plan"],
    ["lmrl.distributed.ray_launch", "lmrl.trl", "lmrl.cli", "lmrl.__main__", "lmrl"],
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


def imports_of(module: str) -> set[str]:
    """The lmrl modules `module` imports (a name imported from a package counts as its submodule
    when there is one)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
    found.discard(module)
    return {m for m in found if m in MODULES}


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

