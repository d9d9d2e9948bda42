"""The fetcher asks the proxy-manager for a lease only while a pool may exist."""

from __future__ import annotations

import time

import pytest

from hutch.models import Lease, Permit, Task
from hutch.services.fetcher.app import Fetcher
from hutch.settings import Settings


class CountingRpc:
    def __init__(self, answer: Lease) -> None:
        self.answer = answer
        self.calls = 0

    async def call(self, *args: object) -> Lease:
        self.calls += 1
        return self.answer


def task() -> Task:
    permit = Permit(id="p", issued=time.time(), expires=time.time() + 30)
    return Task(id="t", job="j", url="http://shop/1", domain="shop", permit=permit)


def fetcher(answer: Lease) -> tuple[Fetcher, CountingRpc]:
    f = Fetcher(Settings())
    rpc = CountingRpc(answer)
    f.rpc = rpc  # type: ignore[assignment]
    f._direct_until = 0.0
    return f, rpc


async def test_a_direct_lease_with_a_lifetime_is_reused_without_asking_again() -> None:
    f, rpc = fetcher(Lease(direct=True, valid_for=10.0))
    leases = [await f._lease(task()) for _ in range(5)]
    assert rpc.calls == 1
    assert all(lease.direct and lease.proxy_id is None for lease in leases)


async def test_once_the_lifetime_is_over_the_fetcher_asks_again(monkeypatch: pytest.MonkeyPatch) -> None:
    f, rpc = fetcher(Lease(direct=True, valid_for=10.0))
    await f._lease(task())
    later = time.monotonic() + 11
    monkeypatch.setattr("hutch.services.fetcher.app.time.monotonic", lambda: later)
    await f._lease(task())
    assert rpc.calls == 2


@pytest.mark.parametrize(
    "answer",
    [Lease(direct=True), Lease(proxy_id="dc1", url="http://127.0.0.1:1", tier="datacenter", valid_for=10.0)],
    ids=["direct-without-lifetime", "a-proxy"],
)
async def test_every_other_answer_is_asked_for_on_every_attempt(answer: Lease) -> None:
    f, rpc = fetcher(answer)
    for _ in range(3):
        await f._lease(task())
    assert rpc.calls == 3
