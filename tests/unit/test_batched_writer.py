"""The AMQP layer's stream writer sends the frames of one loop iteration with one write."""

from __future__ import annotations

import asyncio

from hutch.amqp.transport import _BatchedWriter


class FakeWriter:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.drained = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    async def drain(self) -> None:
        self.drained += 1

    def close(self) -> None:
        self.closed = True


async def test_frames_written_in_one_iteration_go_out_together_and_in_order() -> None:
    raw = FakeWriter()
    writer = _BatchedWriter(raw)  # type: ignore[arg-type]
    for frame in (b"a", b"b", b"c"):
        writer.write(frame)
    assert raw.writes == []
    await asyncio.sleep(0)
    assert raw.writes == [b"abc"]
    writer.write(b"d")
    await asyncio.sleep(0)
    assert raw.writes == [b"abc", b"d"]


async def test_drain_and_close_send_what_is_gathered_first() -> None:
    raw = FakeWriter()
    writer = _BatchedWriter(raw)  # type: ignore[arg-type]
    writer.write(b"x")
    await writer.drain()
    assert (raw.writes, raw.drained) == ([b"x"], 1)
    writer.write(b"y")
    writer.close()
    assert raw.writes == [b"x", b"y"] and raw.closed
    writer.write(b"z")  # after close: dropped, never written to a closing transport
    await asyncio.sleep(0)
    assert raw.writes == [b"x", b"y"]
