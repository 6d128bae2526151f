"""The code that runs inside the sandbox and the judge, tested as the modules it is."""

from __future__ import annotations

import json
import os
import time

from specrepro.tasks.sandbox import inside
from specrepro.tasks.sandbox.inside import codec, seccomp


class _Trickle:
    """Stands in for ``os`` in codec: a source that yields at most ``chunk`` bytes per read, as a slow writer
    on a pipe would."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self.data, self.at, self.chunk = memoryview(data), 0, chunk

    def _take(self, size: int) -> bytes:
        piece = self.data[self.at:self.at + min(size, self.chunk)]
        self.at += len(piece)
        return piece

    def read(self, fd: int, size: int) -> bytes:
        return bytes(self._take(size))

    def readv(self, fd: int, buffers: list) -> int:
        piece = self._take(len(buffers[0]))
        buffers[0][:len(piece)] = piece
        return len(piece)


def test_a_16_mb_frame_in_small_chunks_is_read_in_linear_time(monkeypatch):
    """One preallocated buffer: a frame that arrives 4 KB at a time costs one copy, not one per chunk (growing a
    bytes object chunk by chunk copies ~32 GB here: seconds)."""
    body = json.dumps({"value": "x" * (16 * 1024 * 1024 - 20)}).encode()
    monkeypatch.setattr(codec, "os", _Trickle(len(body).to_bytes(4, "big") + body, 4096))
    start = time.monotonic()
    message = codec.recv_frame(0, 1 << 25)
    assert time.monotonic() - start < 1.0
    assert len(message["value"]) == 16 * 1024 * 1024 - 20
    assert codec.recv_frame(0, 1 << 25) is None  # end of file


def test_frames_round_trip_and_end_of_file_is_none():
    read, write = os.pipe()
    codec.send_frame(write, {"value": codec.encode_value([1, (2.5, "x"), {3: b"\x00"}, {4}, None])})
    os.close(write)
    assert codec.decode_value(codec.recv_frame(read, 1 << 20)["value"]) == [1, (2.5, "x"), {3: b"\x00"}, {4}, None]
    assert codec.recv_frame(read, 1 << 20) is None
    os.close(read)


def test_the_filter_program_is_well_formed():
    program = seccomp.filter_program(1000)
    assert len(program) < 256
    for index, (code, jt, jf, _) in enumerate(program):
        if code in (seccomp.JEQ, seccomp.JGE, seccomp.JSET):
            assert 0 <= jt < 256 and 0 <= jf < 256
            assert index + 1 + max(jt, jf) < len(program)  # every jump lands inside the program
    assert program[-1] == (seccomp.RET, 0, 0, seccomp.ERRNO | seccomp.ENOSYS)
    assert (seccomp.JEQ, 0, 0, 1000) not in program and any(k == 1000 for _, _, _, k in program)


def test_the_launched_texts_are_the_modules():
    for name in ("codec", "seccomp", "harness"):
        assert (inside.HERE / f"{name}.py").read_text() in inside.HARNESS
    assert (inside.HERE / "judge.py").read_text() in inside.JUDGE
    assert "from __future__" not in inside.HARNESS + inside.JUDGE  # would be a syntax error past the first text
