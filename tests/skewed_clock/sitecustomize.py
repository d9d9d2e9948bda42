"""Makes this process's wall clock run `SKEWED_CLOCK_SECONDS` ahead (or behind, if negative).

Tests put this folder on a service process's PYTHONPATH to stand for a host whose clock
disagrees with the others'. Only the wall clock (`time.time`, `time.time_ns`) moves: that
is what differs between hosts; the monotonic clock that paces sleeps is local anyway.
"""

import os
import time

_offset = float(os.environ.get("SKEWED_CLOCK_SECONDS", "0") or 0)
if _offset:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _offset
    time.time_ns = lambda: _time_ns() + int(_offset * 1e9)
