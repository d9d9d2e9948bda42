"""What httpcore's question "is this idle connection's socket readable?" costs the fetcher.

    .venv/bin/python bench/pool_question.py [--questions 20000] [--rounds 5]

Before each request, httpcore's pool asks it of every idle keep-alive connection (a server
may have closed one). On anyio's stream, each question builds every attribute of the
socket, a `getpeername` call among them; the fetcher's `KeptSocketStream` keeps the socket
from the connect and polls it. One loopback connection to a server in this process, asked
the question `--questions` times on each stream, the two alternating for `--rounds` rounds;
the median microseconds a question are printed. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpcore

from hutch.services.fetcher.guard import KeptSocketStream


async def main(questions: int, rounds: int) -> None:
    server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    plain = await httpcore.AnyIOBackend().connect_tcp("127.0.0.1", port, timeout=5)
    streams: dict[str, httpcore.AsyncNetworkStream] = {
        "anyio's stream": plain,
        "KeptSocketStream": KeptSocketStream(plain),
    }
    timings: dict[str, list[float]] = {name: [] for name in streams}
    for _ in range(rounds):
        for name, stream in streams.items():
            start = time.perf_counter()
            for _ in range(questions):
                stream.get_extra_info("is_readable")
            timings[name].append((time.perf_counter() - start) / questions * 1e6)
    for name, times in timings.items():
        each = ", ".join(f"{t:.2f}" for t in times)
        print(f"{name:>16}: {statistics.median(times):.2f} us a question (rounds: {each})")
    await plain.aclose()
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.questions, args.rounds))
