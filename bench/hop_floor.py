"""The floor under Hutch's CPU per page: what one durable hop through RabbitMQ costs.

    .venv/bin/python bench/hop_floor.py [--messages 4000] [--hops 4] [--sizes 1,100] [--rounds 3] [--batch 1]
                                        [--transient] [--queue-version 1]

Hutch hands every task from service to service as a message of its own: durable queues,
persistent messages, publisher confirms, manual acks. This measures that contract and
nothing else, with none of Hutch's code: a chain of `--hops` queues on a RabbitMQ node of
the benchmark's own (`bench/broker_node.py`), one process per hop written directly on
aio-pika, each consuming from its queue and publishing to the next with a confirm before it
acks. A producer process feeds the first queue (confirms in flight together, as `hutch
submit` does); the last process only acks.

For each message size (KB) it prints the median over `--rounds` of: messages per second
through the whole chain, and the CPU milliseconds per message per hop, for the broker's VM
and for the client processes (the hop processes' CPU over the hops; the producer's
separately). Multiplied by the hops a page needs, that is the least any design with one
durable message per task per step can spend, before doing any work of its own.

With `--batch N`, N messages of the size travel as one AMQP message (their bodies end to end)
at every hop: the figures stay per message, so they show what carrying several tasks in one
message would save on the broker's and the client's side of each hop, and nothing of what
packing and unpacking them would cost.

With `--transient` the messages are transient (delivery mode 1) in the same durable queues,
confirmed and acked as before: what persistence costs a hop, which Hutch spares the pages on
their way to the parsers and the items on their way to the storer (`HUTCH_PERSIST_PAGES`).
With `--queue-version 2` the queues are classic queues of version 2, as Hutch declares its
own (the default, 1, is what the figures before the nineteenth round were taken on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aio_pika

sys.path.insert(0, str(Path(__file__).resolve().parent))

PREFETCH = 64
BATCH = 500


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def connect(url: str) -> tuple[aio_pika.abc.AbstractConnection, aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.set_qos(prefetch_count=PREFETCH)
    return connection, channel


def delivery_mode(transient: bool) -> aio_pika.DeliveryMode:
    return aio_pika.DeliveryMode.NOT_PERSISTENT if transient else aio_pika.DeliveryMode.PERSISTENT


async def hop(url: str, source: str, target: str | None, count: int, transient: bool = False) -> None:
    """Consume `count` messages from `source`; each is published to `target` (confirmed), then acked."""
    connection, channel = await connect(url)
    queue = await channel.declare_queue(source, durable=True, passive=True)
    done = asyncio.Event()
    seen = 0
    started = own_cpu()

    async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal seen
        if target is not None:
            out = aio_pika.Message(message.body, delivery_mode=delivery_mode(transient))
            await channel.default_exchange.publish(out, routing_key=target)
        await message.ack()
        seen += 1
        if seen >= count:
            done.set()

    await queue.consume(handle)
    print("ready", flush=True)
    await done.wait()
    print(json.dumps({"cpu": own_cpu() - started}), flush=True)
    await connection.close()


async def produce(url: str, target: str, count: int, size: int, batch: int, transient: bool = False) -> None:
    connection, channel = await connect(url)
    body = os.urandom(size // 2).hex().encode()[:size] * batch
    count //= batch
    started = own_cpu()
    for first in range(0, count, BATCH):
        await asyncio.gather(*(
            channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=delivery_mode(transient)), routing_key=target
            )
            for _ in range(first, min(first + BATCH, count))
        ))
    print(json.dumps({"cpu": own_cpu() - started}), flush=True)
    await connection.close()


async def declare(url: str, names: list[str], queue_version: int = 1) -> None:
    connection, channel = await connect(url)
    for name in names:
        await channel.declare_queue(name, durable=True, arguments={"x-queue-version": queue_version})
    await connection.close()


def child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )


def one_round(
    url: str, broker_pid: int | None, hops: int, count: int, size: int, tag: str, batch: int = 1,
    transient: bool = False, queue_version: int = 1,
) -> dict[str, float]:
    """One round of `count` messages (`count // batch` AMQP messages) through `hops` hops."""
    names = [f"floor.{tag}.{n}" for n in range(hops)]
    asyncio.run(declare(url, names, queue_version))
    workers = [
        child("--role", "hop", "--url", url, "--source", names[n],
              "--target", names[n + 1] if n + 1 < hops else "", "--count", str(count // batch),
              *(["--transient"] if transient else []))
        for n in range(hops)
    ]
    for worker in workers:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            raise SystemExit("a hop process did not start")
    broker_before = cpu_of(broker_pid) if broker_pid else 0.0
    started = time.perf_counter()
    producer = child("--role", "produce", "--url", url, "--target", names[0], "--count", str(count),
                     "--size", str(size), "--batch", str(batch), *(["--transient"] if transient else []))
    produced = json.loads(producer.communicate(timeout=600)[0].strip().splitlines()[-1])
    hop_cpu = 0.0
    for worker in workers:
        out, _ = worker.communicate(timeout=600)
        hop_cpu += json.loads(out.strip().splitlines()[-1])["cpu"]
    seconds = time.perf_counter() - started
    broker = (cpu_of(broker_pid) - broker_before) if broker_pid else float("nan")
    per = 1000.0 / count / hops  # ms per message per hop, from seconds
    return {
        "msgs_per_s": count / seconds,
        "broker_ms": broker * per,
        "clients_ms": hop_cpu * per,
        "producer_ms": produced["cpu"] * 1000.0 / count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--hops", type=int, default=4)
    parser.add_argument("--sizes", default="1,100", help="message sizes in KB, comma separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1, help="messages carried in one AMQP message")
    parser.add_argument("--transient", action="store_true", help="transient messages (delivery mode 1)")
    parser.add_argument("--queue-version", type=int, choices=(1, 2), default=1, help="classic queue version")
    parser.add_argument("--role", choices=("hop", "produce"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "hop":
        asyncio.run(hop(args.url, args.source, args.target or None, args.count, args.transient))
        return
    if args.role == "produce":
        asyncio.run(produce(args.url, args.target, args.count, args.size, args.batch, args.transient))
        return

    from broker_node import private_node

    with private_node() as node:
        print(
            f"broker: a node of its own ({node.nodename}); {args.hops} hops, {args.messages} messages a round, "
            f"{args.batch} to an AMQP message, {'transient' if args.transient else 'persistent'}, "
            f"classic queues version {args.queue_version}",
            flush=True,
        )
        for kb in (int(part) for part in args.sizes.split(",")):
            rounds = [
                one_round(node.url, node.beam_pid(), args.hops, args.messages, kb * 1024, f"{kb}k{n}", args.batch,
                          args.transient, args.queue_version)
                for n in range(args.rounds)
            ]
            print(describe(kb, rounds), flush=True)


def describe(kb: int, rounds: list[dict[str, float]]) -> str:
    def middle(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    broker, clients = middle("broker_ms"), middle("clients_ms")
    together = ", ".join(f"{r['broker_ms'] + r['clients_ms']:.3f}" for r in rounds)
    return (
        f"{kb} KB messages: {middle('msgs_per_s'):.0f} messages/s through the chain; "
        f"ms of CPU per message per hop: broker {broker:.3f}, hop processes {clients:.3f}, "
        f"together {broker + clients:.3f} (producer {middle('producer_ms'):.3f} per message); rounds: {together}"
    )


if __name__ == "__main__":
    main()
