"""Counting XLA compilations, so benchmarks and tests can show a run does not recompile, and
keeping compiled programs on disk, so a new process need not compile them again."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import jax

#: The event JAX records once per backend (XLA) compilation.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclasses.dataclass
class CompilationCounter:
    count: int = 0
    seconds: float = 0.0


@contextlib.contextmanager
def count_compilations() -> Iterator[CompilationCounter]:
    """Counts XLA compilations (and their seconds) inside the `with` block."""
    counter = CompilationCounter()

    def listener(event: str, duration: float, **_) -> None:
        if event == BACKEND_COMPILE_EVENT:
            counter.count += 1
            counter.seconds += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def use_persistent_cache(directory: str | Path) -> bool:
    """Keep XLA's compiled programs in `directory` (JAX's persistent compilation cache): a later
    process that builds the same program (same shapes, settings and JAX version) loads it
    instead of compiling it. Call before the first compilation. A cache directory the user chose
    (`JAX_COMPILATION_CACHE_DIR` or `jax.config`) is left alone.

    Returns
    -------
    bool
        Whether `directory` is now the cache.
    """
    if jax.config.jax_compilation_cache_dir:
        return False
    jax.config.update("jax_compilation_cache_dir", str(Path(directory).expanduser()))
    return True
