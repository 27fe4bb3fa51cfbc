"""An append-only file of text lines that survives a writer killed mid-write.

Every line is appended whole: one `write` of the line and its newline on a file opened in append
mode, under an exclusive advisory lock, so two processes appending to the same file never
interleave their lines. A writer killed during that write can still leave its line cut off: the
file then ends without a newline. Such a *torn* last line is dropped when the file is read (with a
`TornLineWarning`) and cut off the file before the next append, so only the interrupted line is
lost. A bad line anywhere else is not an interruption but corruption; reading reports it with its
line number (see `read_lines`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no flock; appends are still single writes in append mode
    fcntl = None  # type: ignore[assignment]

NEWLINE = b"\n"
_TAIL_CHUNK = 1 << 16


class TornLineWarning(UserWarning):
    """The file ended in a line cut off by an interrupted write; that line was dropped."""


def _lock(handle: BinaryIO, exclusive: bool) -> None:
    """An advisory lock on the whole file, released when `handle` is closed."""
    if fcntl is not None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


def read_lines(path: str | Path) -> list[tuple[int, str]]:
    """The complete lines of `path` as (1-based line number, text without newline).

    A last line without its newline is an interrupted append: it is left out, with a
    `TornLineWarning` naming its line number. Reading takes a shared lock, so a line that another
    process is appending right now is never seen half-written.

    Raises
    ------
    ValueError
        When a complete line is not UTF-8; the message names the file and the line number.
    """
    path = Path(path)
    with path.open("rb") as handle:
        _lock(handle, exclusive=False)
        data = handle.read()
    complete, newline, torn = data.rpartition(NEWLINE)
    raw_lines = complete.split(NEWLINE) if newline else []
    if torn.strip():
        warnings.warn(
            f"{path}:{len(raw_lines) + 1}: the last line is cut off (a write was interrupted); "
            "dropping it, so its run counts as not done and is run again", TornLineWarning, stacklevel=2)
    lines = []
    for number, raw in enumerate(raw_lines, 1):
        try:
            lines.append((number, raw.decode("utf-8")))
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}:{number}: not UTF-8 text ({error})") from error
    return lines


def _cut_torn_tail(handle: BinaryIO, path: Path) -> None:
    """Truncates an unterminated last line (left by a killed writer) off the locked file, so
    the next line does not continue it."""
    size = handle.seek(0, os.SEEK_END)
    if size == 0:
        return
    handle.seek(size - 1)
    if handle.read(1) == NEWLINE:
        return  # the common case: the file ends with a whole line
    end = size
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        handle.seek(start)
        newline = handle.read(end - start).rfind(NEWLINE)
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    warnings.warn(f"{path}: removed a cut-off last line ({size - end} bytes, an interrupted write) "
                  "before appending", TornLineWarning, stacklevel=3)
    handle.truncate(end)


def append_line(path: str | Path, line: str) -> None:
    """Appends `line` (which must not contain a newline) and its newline to `path` in one write.

    The file (and its folder) is created when missing. Under the exclusive lock a cut-off last
    line left by a killed writer is removed first.
    """
    if "\n" in line or "\r" in line:
        raise ValueError("a line to append must not contain a line break")
    path = Path(path)
    data = line.encode("utf-8") + NEWLINE
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unbuffered: each handle.write is one write(2) call, so the line reaches the file whole
    # (the loop only matters if the kernel accepts part of it, e.g. on a full disk).
    with open(path, "a+b", buffering=0) as handle:
        _lock(handle, exclusive=True)
        _cut_torn_tail(handle, path)
        written = 0
        while written < len(data):
            written += handle.write(data[written:])
