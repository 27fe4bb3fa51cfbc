"""Every public function and class has a docstring, with its arguments documented.

Public names: `smc_jax.__all__`, the `__all__` of the public subpackages, and the functions and
classes defined in the public modules without an `__all__` (names not starting with "_"), plus
the public methods of the classes exported by `smc_jax`. A callable that takes arguments needs a
numpy "Parameters" section naming every argument (or "Attributes" for a data class or named tuple whose fields are its
arguments; Google-style "Args:" is accepted too). Protocols, enums and exceptions only need a
docstring. The API reference (docs/api/) is generated from these docstrings.
"""

import enum
import importlib
import inspect
import re
import typing

import pytest

PUBLIC_MODULES = [
    "smc_jax", "smc_jax.sampler", "smc_jax.scoring", "smc_jax.settings", "smc_jax.constraints", "smc_jax.plots",
    "smc_jax.cli", "smc_jax.smc", "smc_jax.smc.ensemble", "smc_jax.smc.exact", "smc_jax.smc.learn",
    "smc_jax.smc.sharding", "smc_jax.smc.batch", "smc_jax.experts", "smc_jax.bytes", "smc_jax.models", "smc_jax.models.flax_adapter",
    "evaluation", "evaluation.tasks",
]
SECTION = re.compile(r"^\s*(Parameters|Attributes|Args|Arguments)\s*:?\s*$", re.M)
AUTO_DOC = re.compile(r"^\w+\(.*\)$", re.S)  # the docstring dataclasses and namedtuples make up


def public_names(module_name):
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, obj in vars(module).items()
                 if not n.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                 and getattr(obj, "__module__", None) == module_name]
    return module, list(names)


def own_doc(obj):
    doc = obj.__doc__ if inspect.isroutine(obj) else vars(obj).get("__doc__")
    if doc and inspect.isclass(obj) and AUTO_DOC.match(doc.strip()):
        return None
    return doc


def arguments(obj):
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p.name for p in signature.parameters.values()
            if p.name not in ("self", "cls") and not p.name.startswith("_")]


def needs_arguments_section(obj):
    if inspect.isclass(obj):
        if issubclass(obj, (BaseException, enum.Enum)) or getattr(obj, "_is_protocol", False):
            return False
        if obj.__init__ is object.__init__ and obj.__new__ is object.__new__:
            return False
    return bool(arguments(obj))


def protocol_doc(cls, attr):
    from smc_jax.smc.ensemble import Ensemble
    from smc_jax.experts import ExpertGroup

    return any(isinstance(getattr(proto, attr, None), typing.Callable) and own_doc(getattr(proto, attr))
               for proto in (ExpertGroup, Ensemble) if attr in vars(proto))


def objects():
    seen = {}
    for module_name in PUBLIC_MODULES:
        module, names = public_names(module_name)
        for name in names:
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue  # constants are documented in the module docstring
            seen.setdefault(f"{obj.__module__}.{obj.__qualname__}", (f"{module_name}.{name}", obj))
    import smc_jax
    for name in smc_jax.__all__:
        cls = getattr(smc_jax, name)
        if not inspect.isclass(cls) or getattr(cls, "_is_protocol", False) or issubclass(cls, BaseException):
            continue
        for attr, member in vars(cls).items():
            if attr.startswith("_") and attr != "__call__":
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) and member.__module__ == cls.__module__:  # not generated (replace)
                if protocol_doc(cls, attr):
                    continue  # implements a documented protocol method (ExpertGroup, Ensemble)
                seen.setdefault(f"{cls.__module__}.{cls.__qualname__}.{attr}", (f"smc_jax.{name}.{attr}", member))
    return sorted(seen.values(), key=lambda item: item[0])


def problems():
    found = []
    for public, obj in objects():
        doc = own_doc(obj)
        if not doc or not doc.strip():
            found.append(f"{public}: no docstring")
        elif needs_arguments_section(obj):
            if not SECTION.search(doc):
                found.append(f"{public}: no Parameters section for ({', '.join(arguments(obj))})")
                continue
            undocumented = [a for a in arguments(obj) if not documented(a, doc)]
            if undocumented:
                found.append(f"{public}: arguments missing in its Parameters section: {', '.join(undocumented)}")
    return found


def documented(argument, doc):
    """`argument` starts an entry ("name : type", "a, name : type", "**name") of a section."""
    entry = rf"^\s*(?:\*\*?)?(?:\w+, )*{argument}(?:, \w+)*(?:\s*:.*)?$"
    return re.search(entry, doc, re.M) is not None


def test_public_names_are_documented():
    missing = problems()
    assert not missing, f"{len(missing)} public names lack documentation:\n" + "\n".join(missing)


def test_the_check_sees_the_api():
    names = {public for public, _ in objects()}
    assert {"smc_jax.sample", "smc_jax.EnsembleSampler", "smc_jax.SMC", "smc_jax.smc.learn.fit"} <= names
    assert len(names) > 100


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_api_reference_lists_the_module(module_name):
    from pathlib import Path

    index = (Path(__file__).resolve().parent.parent / "docs" / "api" / "index.md").read_text()
    if module_name == "smc_jax":
        import smc_jax
        for name in smc_jax.__all__:
            assert re.search(rf"smc_jax\.[\w.]*\b{name}\b", index), f"smc_jax.{name} missing in docs/api/index.md"
    else:
        assert re.search(rf"^\s+{re.escape(module_name)}$", index, re.M), f"{module_name} missing in docs/api/index.md"

