"""What the governor's decoding and encoding cost it a page, apart from everything else.

    .venv/bin/python bench/governor_wire.py [--count 20000] [--rounds 5] [--parked 64]

No broker and no service: this process builds the messages a small-page job gives the
governor (`bench/speed.py --shapes small`: its spec, the sandbox's URLs) and times, through
`hutch.models.encode` and `decode`, the wire work the governor does on them:

- an outcome event as the fetcher publishes it, with the task in it (`Event`): what the
  governor decodes for every attempt, though it reads none of the task's fields;
- the same body decoded by a model holding only the fields the governor reads (`Seen`,
  made here from `Event`'s own declarations of them): what leaving the task out of the governor's decode would save;
- a `Parked` of `--parked` tasks, decoded and encoded: what each park costs the governor
  for its task's wire form (the publish is one per `Parked`, not per task).

It prints the medians over `--rounds` in microseconds (a task, or an event); multiplied by
the events and parks a page (docs/benchmarks.md) they bound what those could save a page.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import ConfigDict, create_model

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed import SPEC_YAML

from hutch.models import Event, Parked, Task, decode, encode, task_id
from hutch.services.parser.spec import parse_spec

# The fields of an outcome event that the governor reads (`services/governor/core.py`), and
# the ones every event must have.
GOVERNOR_READS = ("kind", "task_id", "job", "domain", "attempt", "at", "permit_id", "outcome", "status",
                  "retry_after", "elapsed", "next")
# Those fields as `Event` declares them, the rest of the body ignored (a `Model` would keep
# unknown fields, the task among them).
Seen = create_model(
    "Seen",
    __config__=ConfigDict(extra="ignore"),
    **{name: (Event.model_fields[name].annotation, Event.model_fields[name]) for name in GOVERNOR_READS},
)


def tasks(count: int) -> list[Task]:
    """`count` tasks of a small-page job: `bench/speed.py`'s spec, the sandbox's URLs."""
    spec = parse_spec(yaml.safe_load(SPEC_YAML))
    urls = [f"http://127.0.0.1:9001/page/{i}" for i in range(count)]
    return [Task(id=task_id("bench", url), job="bench", url=url, domain="127.0.0.1:9001", spec=spec, attempts=1)
            for url in urls]


def per_call(fn: Callable[[], object], count: int) -> float:
    """Microseconds a call of `fn`, over `count` calls."""
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000, help="calls a round for one event")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parked", type=int, default=64, help="tasks in the Parked message")
    args = parser.parse_args()
    made = tasks(args.parked)
    task = made[0]
    event = Event(kind="outcome", task_id=task.id, job=task.job, domain=task.domain, attempt=1, outcome="ok",
                  status=200, elapsed=0.02, next="parse", task=task)
    body = encode(event)
    parked = Parked(tasks=made)
    parked_body = encode(parked)
    calls = max(1, args.count // args.parked)
    figures: dict[str, list[float]] = {"event": [], "seen": [], "parked_decode": [], "parked_encode": []}
    for _ in range(args.rounds):
        figures["event"].append(per_call(lambda: decode(body, Event), args.count))
        figures["seen"].append(per_call(lambda: decode(body, Seen), args.count))
        figures["parked_decode"].append(per_call(lambda: decode(parked_body, Parked), calls) / args.parked)
        figures["parked_encode"].append(per_call(lambda: encode(parked), calls) / args.parked)
    median = {name: statistics.median(values) for name, values in figures.items()}
    print(f"outcome event of {len(body)} bytes, {args.rounds} rounds of {args.count} decodes (median µs):")
    print(f"  decoded as Event (with its task): {median['event']:.1f}")
    print(f"  decoded as the governor's fields alone: {median['seen']:.1f}"
          f" (saves {median['event'] - median['seen']:.1f} an event)")
    print(f"Parked of {args.parked} tasks ({len(parked_body)} bytes), {args.rounds} rounds of {calls}"
          " (median µs a task):")
    print(f"  decode {median['parked_decode']:.1f}, encode {median['parked_encode']:.1f},"
          f" a park's wire work {median['parked_decode'] + median['parked_encode']:.1f}")


if __name__ == "__main__":
    main()
