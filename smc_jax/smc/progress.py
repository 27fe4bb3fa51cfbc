"""Optional per-step progress reports between the steps of the sampling loop.

With `SMC(progress=True)` the loop runs one step per dispatch and, between dispatches, tells the
listeners set by `report_progress` the step index and the number of particles still extending.
No host call is compiled into the program (so it stays in the persistent compilation cache);
off by default, the whole loop is one dispatch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

_listeners: list[Callable[[int, int], None]] = []


def report(step: int, num_active: int) -> None:
    """Tells every listener that step `step` is done with `num_active` particles extending.

    Parameters
    ----------
    step : int
        The index of the step just done.
    num_active : int
        Particles still extending after it.
    """
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
