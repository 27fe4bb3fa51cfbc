"""Optional per-step progress reports from inside the jitted sampling loop.

With `SMC(progress=True)` each step calls back to the host (`jax.debug.callback`) with the step
index and the number of particles still extending; the callback forwards to the listener set by
`report_progress`. Off by default: library calls and benchmarks make no host call inside a step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np

_listeners: list[Callable[[int, int], None]] = []


def _on_step(step: np.ndarray, num_active: np.ndarray) -> None:
    for listener in list(_listeners):
        listener(int(step), int(num_active))


@contextlib.contextmanager
def report_progress(listener: Callable[[int, int], None]) -> Iterator[None]:
    """Calls `listener(step, num_active)` after every step of samplers built with progress=True."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
