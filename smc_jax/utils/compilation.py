"""Counting XLA compilations, so benchmarks and tests can show a run does not recompile."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

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
