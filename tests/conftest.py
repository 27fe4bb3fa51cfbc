"""Shared fixtures: toy experts whose ensembles can be enumerated exactly."""

from __future__ import annotations

import gc
import itertools
import os
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

from smc_jax.experts import NGramExpert, TableExpert

# One on-disk XLA compilation cache for the whole test run: both xdist workers, and the
# subprocesses and notebook kernels the tests start (they read the environment variables). The
# module-level cache clearing below and the two workers would otherwise compile the same
# real-model programs again. Only programs that took >= 1 s to compile are stored.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(tempfile.gettempdir()) / "smc_jax_tests_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
# Most of the suite's time is XLA compiling programs that then run for milliseconds: with LLVM's
# optimizations off, a toy byte-level test takes 16% less time and a SmolLM2 byte test 25% less.
# Subprocesses and notebook kernels inherit it. SMC_JAX_TEST_OPTIMIZE=1 keeps them.
if os.environ.get("SMC_JAX_TEST_OPTIMIZE") != "1":
    os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
jax.config.update("jax_disable_most_optimizations", os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS") == "1")

ALPHABET = "abc"


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
    """Frees the programs a test module compiled once it is done.

    XLA:CPU maps memory for every compiled program and keeps it while the program is cached. The
    kernel caps the mappings of a process (vm.max_map_count, 65530 by default) and the whole suite
    compiles thousands of programs: without this, a full run ends in a segfault inside the compiler
    once mmap starts failing."""
    yield
    jax.clear_caches()
    gc.collect()


def random_table(seed: int, alphabet: str = ALPHABET, max_len: int = 4, size: int = 14, bias: str = "") -> dict[str, float]:
    """A random table over strings of length 0..max_len; strings starting with `bias` get more mass."""
    rng = np.random.default_rng(seed)
    pool = ["".join(t) for n in range(max_len + 1) for t in itertools.product(alphabet, repeat=n)]
    chosen = rng.choice(len(pool), size=size, replace=False)
    probs = rng.gamma(0.7, size=size) + np.array([2.0 if pool[i].startswith(bias) and bias else 0.0 for i in chosen])
    probs /= probs.sum()
    return {pool[i]: float(p) for i, p in zip(chosen, probs)}


@pytest.fixture(scope="session")
def overlapping_tables() -> tuple[TableExpert, TableExpert]:
    """Two table experts over 'abc' whose supports overlap on several strings."""
    base = random_table(1, size=10)
    t1 = dict(base)
    t2 = random_table(2, size=10)
    for s in list(base)[:5]:  # shared strings, so min/product ensembles have mass
        t2[s] = t2.get(s, 0.0) + 0.1
    z2 = sum(t2.values())
    t2 = {s: p / z2 for s, p in t2.items()}
    return TableExpert.from_table(t1, alphabet=ALPHABET), TableExpert.from_table(t2, alphabet=ALPHABET)


@pytest.fixture(scope="session")
def ngram_experts() -> tuple[NGramExpert, NGramExpert]:
    k1, k2 = jax.random.split(jax.random.key(7))
    return (
        NGramExpert.random(k1, alphabet_size=2, order=2, eos_logit=0.5),
        NGramExpert.random(k2, alphabet_size=2, order=3, eos_logit=0.5),
    )


def pytest_runtest_logreport(report):
    """With SMC_JAX_TEST_TIMES=path, appends every test phase's seconds to that JSON-lines file as
    it finishes (a partial run still tells where the time went; --durations prints at the end)."""
    path = os.environ.get("SMC_JAX_TEST_TIMES")
    if path:
        import json

        with open(path, "a") as out:
            out.write(json.dumps({"test": report.nodeid, "when": report.when, "seconds": round(report.duration, 2)}) + "\n")


#: Test files that take longest (mostly XLA compilation: ~20 min for the notebooks and for the byte
#: beam's toy programs, 5-9 min for the others, measured with SMC_JAX_TEST_TIMES on 2 cores),
#: longest first. They are collected first, so that under `pytest -n 2 --dist loadfile` a worker
#: starts each of them early instead of one worker running a 20-minute file alone at the end.
LONGEST_FIRST = ("test_notebooks.py", "test_beam.py", "test_sharding.py", "test_exact.py")


def pytest_configure(config):
    """pytest-xdist's loadfile scheduler sorts files by test count unless told not to: keep the
    collection order above (the longest files first)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Moves LONGEST_FIRST to the front, then the files with slow tests, keeping each file's tests
    together and in order."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item):
        name = item.path.name
        if name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST) + (0 if item.path in slow_files else 1)

    items.sort(key=rank)  # stable: files stay contiguous, tests keep their order
