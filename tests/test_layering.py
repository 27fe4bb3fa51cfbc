"""The package's one-way data flow (docs/architecture.md): a module imports only from its own
layer or the layers below it, never from above.

    top:     api, cli, settings, plots, learn, sharding, evaluation/, tasks/  (what users call)
    smc:     smc/, ensemble, exact                 (the sampler, the f-ensembles, exact targets)
    experts: experts/                              (distributions over symbols, per particle)
    bytes:   bytes/                                (tokenizations as byte beams: tries, sum trees)
    models:  models/                               (transformers, weights, the context store)
    utils:   utils/                                (helpers with no package imports)

Imports inside functions count too: a lazy import from above is still a cycle in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "smc_jax"

LAYERS = ["utils", "models", "bytes", "experts", "smc", "top"]  # bottom to top
PLACEMENT = {  # first path component under smc_jax/ (module name without .py) -> layer
    "utils": "utils",
    "models": "models",
    "bytes": "bytes",
    "experts": "experts",
    "constraints": "experts",  # compiles regex / JSON Schema automata for experts/constraint.py
    "smc": "smc",
    "ensemble": "smc",
    "exact": "smc",
    "api": "top",
    "cli": "top",
    "settings": "top",
    "scorer": "top",  # batched byte-level scoring, built on api
    "plots": "top",
    "learn": "top",
    "sharding": "top",
    "evaluation": "top",
    "tasks": "top",
    "__init__": "top",  # the package root re-exports the public names of every layer
}


def layer_of(parts: tuple[str, ...]) -> str:
    """The layer of a module given its dotted path under smc_jax (() is the package root)."""
    if not parts:
        return "top"
    if parts[0] not in PLACEMENT:
        raise AssertionError(f"smc_jax.{'.'.join(parts)} has no layer: add it to PLACEMENT")
    return PLACEMENT[parts[0]]


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imported(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, dotted path under smc_jax) of every smc_jax import in the file, anywhere in it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = path.relative_to(PACKAGE).with_suffix("").parts
    package = here[:-1]  # relative imports resolve against the module's package
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(("smc_jax", *base, *(node.module.split(".") if node.module else ())))
            else:
                module = node.module or ""
            # `from smc_jax import experts` names a subpackage: the imported names count.
            names = [module] if module != "smc_jax" else [f"smc_jax.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name == "smc_jax" or name.startswith("smc_jax."):
                out.append((node.lineno, tuple(name.split(".")[1:])))
    return out


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


def test_the_checker_sees_upward_imports(tmp_path):
    # A model module importing the sampler must be caught (guards against a checker that
    # silently passes, e.g. by resolving no import).
    parts = ("models", "lm")
    assert LAYERS.index(layer_of(("smc", "engine"))) > LAYERS.index(layer_of(parts))
    source = PACKAGE / "models" / "lm.py"
    assert any(target[0] == "models" for _, target in imported(source))
