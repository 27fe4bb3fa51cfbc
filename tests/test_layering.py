"""The package's one-way data flow (docs/architecture.md): folders are layers, a module imports
only from its own layer or the layers below it, and no import circle exists anywhere.

    top:     __init__, sampler, scoring, settings, cli, plots, constraints   (the public face)
    smc:     smc/       (the engine, f-ensembles, exact targets, sharding, learning)
    experts: experts/   (distributions over symbols per particle; constraint compilation)
    bytes:   bytes/     (tokenizations as byte beams: tries, sum trees, healing)
    models:  models/    (transformers, weights, the context store)
    utils:   utils/     (helpers with no package imports)

Imports inside functions count too: a lazy import is still an edge of the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "smc_jax"

LAYERS = ["utils", "models", "bytes", "experts", "smc", "top"]  # bottom to top
FOLDERS = {"utils", "models", "bytes", "experts", "smc"}  # each folder is its layer
PUBLIC_FACE = {"__init__", "sampler", "scoring", "settings", "cli", "plots", "constraints"}


def layer_of(parts: tuple[str, ...]) -> str:
    """The layer of a module given its dotted path under smc_jax (() is the package root)."""
    if not parts or parts == ("__init__",):
        return "top"
    if parts[0] in FOLDERS:
        return parts[0]
    if len(parts) == 1 and parts[0] in PUBLIC_FACE:
        return "top"
    raise AssertionError(f"smc_jax.{'.'.join(parts)} is in no layer: put it in a layer's folder")


def module_name(path: Path, package: Path = PACKAGE) -> tuple[str, ...]:
    """A file's dotted path under the package; a package's __init__ is the package itself."""
    parts = path.relative_to(package).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def modules(package: Path = PACKAGE) -> list[Path]:
    return sorted(package.rglob("*.py"))


def _is_module(parts: tuple[str, ...], package: Path) -> bool:
    base = package.joinpath(*parts)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imported(path: Path, package: Path = PACKAGE) -> list[tuple[int, tuple[str, ...]]]:
    """(line, dotted path under the package) of every package module the file imports, anywhere
    in it: `from a.b import c` names module a.b.c when c is a module, else a.b."""
    root = package.name
    tree = ast.parse(path.read_text(), filename=str(path))
    here = path.relative_to(package).with_suffix("").parts
    own_package = here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_package[: len(own_package) - (node.level - 1)]
                module = [root, *base, *(node.module.split(".") if node.module else ())]
            else:
                module = (node.module or "").split(".")
            targets = []
            for alias in node.names:
                sub = tuple(module[1:]) + (alias.name,)
                targets.append(module + [alias.name] if module[0] == root and _is_module(sub, package) else module)
        else:
            continue
        for target in targets:
            if target[0] == root:
                out.append((node.lineno, tuple(target[1:])))
    return out


def import_graph(package: Path = PACKAGE) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for path in modules(package):
        name = module_name(path, package)
        graph.setdefault(name, set()).update(t for _, t in imported(path, package) if t != name)
    return graph


def find_cycle(graph: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[tuple[str, ...]] | None:
    """One import circle of the graph (its modules in order, the first repeated last), or None."""
    state: dict[tuple[str, ...], int] = {}  # 1: on the current path, 2: done
    stack: list[tuple[str, ...]] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_module_has_a_layer():
    for path in modules():
        layer_of(path.relative_to(PACKAGE).with_suffix("").parts)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_from_a_layer_above_it(path):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    own = LAYERS.index(layer_of(parts))
    upward = [
        f"line {line}: smc_jax.{'.'.join(target)} ({layer_of(target)})"
        for line, target in imported(path)
        if LAYERS.index(layer_of(target)) > own
    ]
    assert not upward, f"{path.relative_to(PACKAGE)} ({layer_of(parts)} layer) imports from above: {upward}"


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join("smc_jax." + ".".join(m) if m else "smc_jax" for m in cycle)


def test_the_checkers_see_upward_imports_and_circles(tmp_path):
    # Guards against checkers that silently pass (e.g. by resolving no import).
    assert any(target[0] == "models" for _, target in imported(PACKAGE / "models" / "lm.py"))
    pkg = tmp_path / "smc_jax"
    (pkg / "smc").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "smc" / "__init__.py").write_text("")
    (pkg / "smc" / "a.py").write_text("from smc_jax.smc.b import x\n")
    (pkg / "smc" / "b.py").write_text("def f():\n    from smc_jax.smc import a\n")
    (pkg / "sampler.py").write_text("from . import settings\n")
    (pkg / "settings.py").write_text("")
    graph = import_graph(pkg)
    assert graph[("sampler",)] == {("settings",)}
    assert find_cycle(graph) == [("smc", "a"), ("smc", "b"), ("smc", "a")]
    (pkg / "smc" / "b.py").write_text("x = 1\n")
    assert find_cycle(import_graph(pkg)) is None
