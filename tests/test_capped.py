"""fleetrun.capped: a stream written under a cap keeps its head and its tail with a
marker between them (issue 21 item 5); the shepherd's copy of the writer cuts alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetrun import capped, shepherd


def write_through(cls: type, path: Path, chunks: list[bytes], cap: int) -> tuple[bytes, int]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        w = cls(fd, cap)
        for c in chunks:
            w.write(c)
        cut = w.close()
    finally:
        os.close(fd)
    return path.read_bytes(), cut


@pytest.mark.parametrize(
    "sizes", [[10], [4096], [4097], [1, 2, 3, 5000, 7], [3000, 3000, 3000], [100_000], [2_000_000, 5]]
)
def test_head_and_tail_kept_with_a_marker_between(tmp_path: Path, sizes: list[int]) -> None:
    cap = 4096
    stream = b"".join(bytes([65 + i % 26]) * n for i, n in enumerate(sizes))
    pos, chunks = 0, []
    for n in sizes:
        chunks.append(stream[pos : pos + n])
        pos += n
    got, cut = write_through(capped.CappedWriter, tmp_path / "out", chunks, cap)
    if len(stream) <= cap:
        assert (got, cut) == (stream, 0)
    else:
        assert cut == len(stream) - cap
        mark = capped.marker(cut, cap)
        assert got == stream[: cap // 2] + mark + stream[-(cap - cap // 2) :]
        assert len(got) == cap + len(mark)
    # the shepherd, which cannot import the package, keeps a copy: it must cut alike
    assert write_through(shepherd.CappedLog, tmp_path / "log", chunks, cap) == (got, cut)


def test_the_marker_says_what_was_cut() -> None:
    assert capped.marker(199_000_009, 1_000_000) == (
        b"\n[fleetrun: 199,000,009 bytes cut: output over its 1.0 MB cap]\n"
    )
    assert capped.cut_note(1_000_000_000, 20_000_000) == "output cut: 1.0 GB over the 20 MB cap"
    assert [capped.size_text(n) for n in (5, 4096, 20_000_000, 123_456_789)] == ["5 bytes", "4.1 kB", "20 MB", "123 MB"]
    assert shepherd.size_text(123_456_789) == "123 MB"
    assert shepherd.MAX_OUTPUT == capped.DEFAULT_MAX_BYTES and shepherd.MIN_OUTPUT == capped.MIN_MAX_BYTES
