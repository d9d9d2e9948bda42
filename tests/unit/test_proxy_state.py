"""The proxy-manager's state file: bans, dead proxies and learned tiers survive a restart,
the file is replaced atomically, and it never holds a proxy URL."""

from __future__ import annotations

import json
from pathlib import Path

from hutch.models import Event, LeaseRequest
from hutch.services.proxy_manager import state
from hutch.services.proxy_manager.health import HealthConfig
from hutch.services.proxy_manager.leases import Selector, SelectorConfig, describe
from hutch.services.proxy_manager.pool import parse_pool
from hutch.services.proxy_manager.tiers import TierConfig

POOL = """\
http://alice:hunter2@dc1.example:8080 datacenter
http://alice:hunter2@dc2.example:8080 datacenter
http://bob:s3cret@res1.example:3128 residential
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def make(clock: Clock) -> Selector:
    from hutch.services.proxy_manager.pool import PoolConfig

    s = Selector(
        SelectorConfig(
            rate_cap=1e6,
            health=HealthConfig(ban_seconds=300, dead_after=1, probe_interval=30, active_probe=True),
            tiers=TierConfig(escalate_blocks=2, window=60, trial_interval=600),
        ),
        clock,
    )
    s.set_pool(PoolConfig(tuple(parse_pool(POOL))))
    return s


def outcome(s: Selector, domain: str, task: str, result: str) -> str | None:
    lease = s.lease(LeaseRequest(task_id=task, domain=domain))
    s.report(
        Event(
            kind="outcome", task_id=task, job="j", domain=domain, attempt=1,
            outcome=result, proxy_id=lease.proxy_id, tier=lease.tier,
        )
    )
    return lease.proxy_id


def test_bans_dead_proxies_and_learned_tiers_survive_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    first = make(clock)
    guarded_1 = outcome(first, "guarded", "g1", "blocked")
    outcome(first, "guarded", "g2", "blocked")  # two blocks: guarded needs residential
    banned = outcome(first, "open", "o1", "blocked")  # one block: a ban on open, no escalation
    dc_ids = [p.id for p in first.proxies.values() if p.tier == "datacenter"]
    path = tmp_path / state.FILENAME
    state.write_atomically(path, state.snapshot(first))

    second = make(clock)
    assert state.load_into(second, path)
    assert second.lease(LeaseRequest(task_id="g3", domain="guarded")).tier == "residential"
    others = {second.lease(LeaseRequest(task_id=f"o{i}", domain="open")).proxy_id for i in range(2, 8)}
    assert others == set(dc_ids) - {banned}
    assert guarded_1 in dc_ids
    assert second.health.banned_until(guarded_1, "guarded", clock.now) is not None


def test_a_dead_proxy_stays_dead_across_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    first = make(clock)
    dead = outcome(first, "any", "t1", "proxy_failure")
    assert dead is not None and first.health.is_dead(dead)
    path = tmp_path / state.FILENAME
    state.write_atomically(path, state.snapshot(first))
    second = make(clock)
    state.load_into(second, path)
    assert second.health.is_dead(dead)
    assert all(second.lease(LeaseRequest(task_id=f"t{i}", domain="x")).proxy_id != dead for i in range(5))


def test_the_state_file_holds_ids_and_domains_but_no_url_or_credential(tmp_path: Path) -> None:
    clock = Clock()
    s = make(clock)
    for i in range(3):
        outcome(s, "guarded", f"g{i}", "blocked")
    outcome(s, "any", "p", "proxy_failure")
    path = tmp_path / state.FILENAME
    state.write_atomically(path, state.snapshot(s))
    text = path.read_text()
    for secret in ("alice", "hunter2", "bob", "s3cret", "example:", "http://"):
        assert secret not in text
    assert "guarded" in text and "residential" in text
    summary = json.dumps(s.summary())
    for secret in ("hunter2", "s3cret", "alice", "http://"):
        assert secret not in summary


def test_log_lines_of_changes_name_proxies_by_id_only() -> None:
    clock = Clock()
    s = make(clock)
    lines = []
    for i in range(3):
        lease = s.lease(LeaseRequest(task_id=f"g{i}", domain="guarded"))
        lines += describe(
            s.report(
                Event(kind="outcome", task_id=f"g{i}", job="j", domain="guarded", attempt=1,
                      outcome="blocked", proxy_id=lease.proxy_id, tier=lease.tier)
            )
        )
    assert any("banned on guarded" in line for line in lines)
    assert any("datacenter -> residential" in line for line in lines)
    assert not any("hunter2" in line or "http://" in line for line in lines)


def test_writing_replaces_the_file_whole_and_leaves_no_temporary_behind(tmp_path: Path) -> None:
    path = tmp_path / "sub" / state.FILENAME
    state.write_atomically(path, {"v": 1, "n": 1})
    state.write_atomically(path, {"v": 1, "n": 2})
    assert json.loads(path.read_text()) == {"v": 1, "n": 2}
    assert [p.name for p in path.parent.iterdir()] == [state.FILENAME]


def test_a_missing_or_unreadable_state_file_means_a_fresh_start(tmp_path: Path) -> None:
    s = make(Clock())
    assert not state.load_into(s, tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert not state.load_into(s, broken)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"v": 99, "tiers": [{"domain": "x", "tier": "mobile"}]}))
    state.load_into(s, other)
    assert s.tiers.level("x") == 0
