"""A ready service's garbage collector (`HUTCH_GC_THRESHOLD`): its startup frozen, young passes spaced.

Each case runs in a fresh interpreter, so this test process's own collector stays as it is.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, sys
from hutch.service import tune_gc

class Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it

before = gc.get_threshold()
tune_gc(int(sys.argv[1]))
frozen = gc.get_freeze_count()
after = gc.get_threshold()
gc.collect()
made = [Node() for _ in range(1000)]
del made
freed = gc.collect()  # cycles made after the freeze are still found
print(json.dumps({"before": before, "after": after, "frozen": frozen, "freed": freed}))
"""


def probe(threshold: int) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(threshold)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_ready_service_freezes_what_it_built_and_spaces_its_young_passes() -> None:
    seen = probe(10_000)
    assert seen["before"] == [700, 10, 10]
    assert seen["after"] == [10_000, 10, 10]
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 10_000  # the modules, the models
    assert isinstance(seen["freed"], int) and seen["freed"] >= 1000


def test_threshold_zero_leaves_pythons_collector_untouched() -> None:
    seen = probe(0)
    assert seen["after"] == seen["before"] == [700, 10, 10]
    assert seen["frozen"] == 0
    assert isinstance(seen["freed"], int) and seen["freed"] >= 1000
