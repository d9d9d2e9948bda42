"""The metrics layer without a broker: bounded domain labels, lazy families, the port's answers."""

from __future__ import annotations

import asyncio

from hutch.metrics import OTHER, DomainLabels, Endpoint, Metrics


def test_the_first_domains_get_labels_and_the_rest_are_other_until_they_are_busier() -> None:
    forgotten: list[str] = []
    labels = DomainLabels(2, forget=forgotten.append)
    assert labels("a") == "a" and labels("b") == "b"
    assert labels("c") == OTHER  # a third domain, once: no label of its own
    for _ in range(3):
        labels("a")
    # c needs twice the count of the quietest labelled domain (b, 1) to take its place.
    assert labels("c") == "c"
    assert forgotten == ["b"]
    assert labels.named == {"a", "c"}
    assert labels("b") == OTHER


def test_domain_counts_stay_bounded_on_a_crawl_of_many_hosts() -> None:
    labels = DomainLabels(5)
    for n in range(10_000):
        labels(f"host{n}.example")
    assert len(labels.named) == 5
    assert len(labels.counts) <= 4 * 5 + 1


def test_no_domain_labels_at_all_when_the_setting_is_zero() -> None:
    assert DomainLabels(0)("a") == OTHER


def test_a_domain_that_loses_its_label_loses_its_series() -> None:
    metrics = Metrics(top_domains=1)
    metrics.count(metrics.fetches, "a", "ok")
    text = metrics.exposition().decode()
    assert 'hutch_fetches_total{domain="a",outcome="ok"} 1.0' in text
    metrics.count(metrics.fetches, "b", "ok")  # other: 1 is not twice a's 1
    metrics.count(metrics.fetches, "b", "ok")  # 2 >= 2 x 1: b takes a's place
    text = metrics.exposition().decode()
    assert 'domain="a"' not in text
    assert 'hutch_fetches_total{domain="b",outcome="ok"} 1.0' in text
    assert 'hutch_fetches_total{domain="other",outcome="ok"} 1.0' in text


def test_a_service_exports_only_the_families_it_used() -> None:
    metrics = Metrics()
    metrics.stored.inc()
    text = metrics.exposition().decode()
    assert "hutch_items_stored_total 1.0" in text
    assert "hutch_task_age_seconds" not in text and "hutch_permits" not in text
    assert "process_resident_memory_bytes" in text


async def ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:  # closed with our bytes unread: the kernel resets
        return b""
    finally:
        writer.close()


async def test_the_port_answers_health_readiness_and_metrics() -> None:
    ready = False
    endpoint = Endpoint(Metrics(), lambda: ready, "127.0.0.1", 0)
    port = await endpoint.start()
    try:
        assert (await ask(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        assert (await ask(port, b"GET /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503 ")
        ready = True
        assert (await ask(port, b"GET /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        metrics = await ask(port, b"GET /metrics?x=1 HTTP/1.1\r\n\r\n")
        assert metrics.startswith(b"HTTP/1.1 200 ") and b"process_cpu_seconds_total" in metrics
        assert (await ask(port, b"GET /nothing HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
        assert (await ask(port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
        # A head that never ends, or is too long, gets no answer and holds nothing.
        assert await ask(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n") == b""
    finally:
        await endpoint.close()
