"""The append-only line file under the record store: whole-line appends, torn last lines."""

from __future__ import annotations

import json
import threading
import warnings

import pytest

from evaluation.jsonl import TornLineWarning, append_line, read_lines


def test_lines_round_trip_with_their_numbers(tmp_path):
    path = tmp_path / "sub" / "lines.jsonl"
    for text in ["a", "", "ü ✓"]:
        append_line(path, text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_lines(path) == [(1, "a"), (2, ""), (3, "ü ✓")]


def test_empty_file_and_line_breaks_in_a_line(tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"")
    assert read_lines(path) == []
    with pytest.raises(ValueError, match="line break"):
        append_line(path, "two\nlines")


@pytest.mark.parametrize("content, kept", [
    (b"abc", []),                      # the first line was cut off
    (b"a\nb\nhalf", ["a", "b"]),
    (b"a\n\xe2\x9c", ["a"]),           # cut inside a UTF-8 character
])
def test_torn_last_line_is_dropped_with_its_number_then_cut_by_the_next_append(tmp_path, content, kept):
    path = tmp_path / "lines.jsonl"
    path.write_bytes(content)
    with pytest.warns(TornLineWarning, match=f"lines.jsonl:{len(kept) + 1}: the last line is cut off"):
        assert [text for _, text in read_lines(path)] == kept
    with pytest.warns(TornLineWarning, match="removed a cut-off last line"):
        append_line(path, "next")
    assert path.read_bytes() == b"".join(k.encode() + b"\n" for k in kept) + b"next\n"


def test_concurrent_appends_never_interleave(tmp_path):
    # Lines far longer than any buffer; each writer opens the file itself, as two processes would.
    path = tmp_path / "lines.jsonl"
    per_writer, payload = 50, "x" * 100_000

    def writer(name: str) -> None:
        for i in range(per_writer):
            append_line(path, json.dumps({"writer": name, "i": i, "payload": payload}))

    threads = [threading.Thread(target=writer, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = [json.loads(text) for _, text in read_lines(path)]
    assert sorted((r["writer"], r["i"]) for r in records) == [(w, i) for w in "ab" for i in range(per_writer)]


def test_a_torn_line_longer_than_the_tail_chunk_is_cut_whole(tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"kept\n" + b"y" * 200_000)
    with pytest.warns(TornLineWarning, match="200000 bytes"):
        append_line(path, "next")
    assert path.read_bytes() == b"kept\nnext\n"
