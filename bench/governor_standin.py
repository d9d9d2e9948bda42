"""A stand-in for the fetchers in the permits benchmark: acks each task, emits its outcome.

It consumes `fetch.ready` as a fetcher does (prefetch = its concurrency), publishes an `ok`
outcome event naming the permit (confirmed) and only then acks; it sends a heartbeat every
second, and writes its running count (in all and per job) to the file named by `BENCH_COUNTS`,
one line a second. With `BENCH_TASK_LOG` it also writes a line per task (when it took it, when
its permit was issued, job, domain): for small runs that check a limit.
It is kept lean (aiormq's channel under aio-pika, JSON read with `json.loads`) so that the benchmark measures
the governor and not it. Run by `bench/governor_permits.py` and `bench/frontier_*.py`; it never fetches anything.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time

from aiormq.abc import DeliveredMessage

from hutch.amqp import Broker
from hutch.models import Event, FetcherHeartbeat, encode
from hutch.settings import Settings

CONCURRENCY = int(os.environ.get("BENCH_STANDIN_CONCURRENCY", "1000"))


async def main() -> None:
    settings = Settings()
    broker = await Broker(settings, "standin").connect(declare=False)
    topology = broker.topology
    # Outcomes alternate between two connections, as the governor's releases do.
    publishers = [broker, await Broker(settings, "standin").connect(declare=False)]
    turn = itertools.cycle(publishers)
    state = {"count": 0, "busy": 0, "age": 0.0}
    per_job: dict[str, int] = {}
    log_path = os.environ.get("BENCH_TASK_LOG")
    task_log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: ASYNC230 (flushed once a second)

    channel = await broker.channel(prefetch=CONCURRENCY)
    await channel.declare_queue(topology.fetch_ready, passive=True)
    raw = await channel.get_underlay_channel()  # aiormq's channel: no per-message wrapper objects

    async def on_task(message: DeliveredMessage) -> None:
        state["busy"] += 1
        tag = message.delivery.delivery_tag
        try:
            task = json.loads(message.body)
            permit = task.get("permit") or {}
            took = time.time()
            state["age"] += took - permit.get("issued", took)
            event = Event(
                kind="outcome",
                task_id=task["id"],
                job=task["job"],
                domain=task["domain"],
                attempt=task.get("attempts", 0) + 1,
                permit_id=permit.get("id"),
                fetcher="standin",
                outcome="ok",
                status=200,
                next="parse",
            )
            await next(turn).publish(topology.events, f"outcome.{task['domain']}", encode(event))
            await raw.basic_ack(tag, wait=False)  # as hutch.amqp.Delivery acks
            state["count"] += 1
            per_job[task["job"]] = per_job.get(task["job"], 0) + 1
            if task_log is not None:
                row = {"t": took, "issued": permit.get("issued"), "job": task["job"], "domain": task["domain"]}
                task_log.write(json.dumps(row) + "\n")
        except Exception:
            await raw.basic_reject(tag, requeue=True, wait=False)
        finally:
            state["busy"] -= 1

    await raw.basic_consume(topology.fetch_ready, on_task)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("standin ready (broker ", flush=True)
    with open(os.environ["BENCH_COUNTS"], "a", encoding="utf-8") as out:  # noqa: ASYNC230 (one line a second)
        while not stop.is_set():
            beat = FetcherHeartbeat(fetcher="standin", concurrency=CONCURRENCY, busy=state["busy"])
            await broker.publish(topology.events, "fetcher.heartbeat", beat, mandatory=False, persistent=False)
            # `age`: the sum of the permits' ages when their tasks reached the stand-in.
            row = {"t": time.time(), "count": state["count"], "age": state["age"], "jobs": per_job}
            out.write(json.dumps(row) + "\n")
            out.flush()
            if task_log is not None:
                task_log.flush()
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass
    for publisher in publishers:
        await publisher.close()
    if task_log is not None:
        task_log.close()


if __name__ == "__main__":
    asyncio.run(main())  # asyncio's loop, as the fetchers run
