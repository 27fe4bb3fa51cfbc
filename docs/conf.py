"""Sphinx configuration of the smc_jax documentation site.

Why Sphinx + myst-nb: it is what the JAX ecosystem's libraries use (JAX itself, optax and
blackjax build their sites this way), so the site looks and cross-links like theirs
(intersphinx into JAX, NumPy and optax); the pages are Markdown (MyST) rather than reST;
myst-nb renders the Jupyter notebooks in ``notebooks/`` as pages, from their committed outputs
(``nb_execution_mode = "off"``: the build runs no model, the tests execute the notebooks); and
autodoc + autosummary + napoleon generate the API reference from the numpy-style docstrings.

Build: ``bash .ci/docs`` (warnings are errors, ``nitpicky`` cross-references).
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

project = "smc_jax"
author = "smc_jax authors"
copyright = "2026, smc_jax authors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax 3 served from _static: formulas render without a network
    "sphinx.ext.viewcode",
]

# Pages and notebooks: docs/notebooks is a symbolic link to ../notebooks (one copy of each).
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints", "_templates"]
templates_path = ["_templates"]
default_role = "literal"  # `x` in docstrings is code, as in the README

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # render the committed outputs; tests/test_notebooks.py executes them
nb_merge_streams = True

# API reference.
autosummary_generate = True
autosummary_ignore_module_all = False


def _modules_with_all():
    import importlib
    import pkgutil

    import evaluation
    import smc_jax

    names = []
    for package in (smc_jax, evaluation):
        names += [package.__name__] + [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return [n for n in names if hasattr(importlib.import_module(n), "__all__")]


# Modules with an __all__ document its constants (imported ones included); others their own.
autosummary_context = {"modules_with_all": _modules_with_all()}
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # signatures stay readable; shapes and types are in the docstrings
autoclass_content = "class"
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True

# Broken references are build errors (.ci/docs runs sphinx-build -W --keep-going -n).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jnp|np|numpy|optax|chex|flax|jaxtyping|typing|collections|pathlib|enum|abc|dataclasses)\..*"),
    (r"py:.*", r"(Array|ArrayLike|PRNGKey|PyTree|Callable|Sequence|Mapping|Iterable|Iterator|Any|Optional|Union)"),
    (r"py:obj", r"evaluation\.tasks\.base\.InstanceT"),  # a TypeVar
    # The types in numpy docstrings are prose ("jax.Array, shape [M, K]", {"eos", "truncate"}),
    # not references; references to smc_jax's own classes must still resolve.
    (r"py:class", r"(?!smc_jax\.).*"),
    (r"py:class", r"(optional|array|array-like|callable|str|int|float|bool|tuple|list|dict|None|default.*|shape.*)"),
]

intersphinx_mapping = {}  # the CI machine may not reach external inventories; references stay local

html_theme = "sphinx_book_theme"
html_title = "smc_jax"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
}


def _drop_type_docstrings(app, what, name, obj, options, lines):
    """A constant without a doc comment would show its type's docstring (dict, int): drop it."""
    import inspect
    import types

    if isinstance(obj, types.GenericAlias):  # a type alias such as Chat = list[Message]
        lines[:] = [f"Type alias: ``{obj!r}``."]
        return
    if what in ("data", "attribute") and lines:
        type_doc = inspect.getdoc(type(obj)) or ""
        if type_doc and lines[0].strip() == type_doc.splitlines()[0].strip():
            lines.clear()


def setup(app):
    app.connect("autodoc-process-docstring", _drop_type_docstrings)
