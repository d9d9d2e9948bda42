"""What the proxies cost: requests per tier and estimated cost, per job and domain.

Read from the store's attempt history (one row per outcome event, with the lease's tier and
cost). Only events of real requests count: ones that carry a proxy, plus direct attempts;
events of tasks returned without a request (an expired permit, no lease, no proxy free)
do not. A direct request (no pool) shows as tier `direct` with cost 0.
"""

from __future__ import annotations

from typing import Any

from hutch.models import NO_REQUEST, Outcome
from hutch.store import Store

# Outcomes of attempts that sent a request (a direct attempt has no proxy to tell it by).
REQUEST_OUTCOMES: tuple[Outcome, ...] = (
    "ok",
    "timeout",
    "reset",
    "proxy_failure",
    "blocked",
    "throttled",
    "server_error",
    "not_found",
    "client_error",
    "too_large",
    "redirect",
    "redirects",
)
TIER_ORDER = {"direct": 0, "datacenter": 1, "residential": 2, "mobile": 3}


def cost_summary(store: Store, job: str | None = None) -> list[dict[str, Any]]:
    """One row per (job, domain, tier): `requests`, `ok` (of those, successes) and `cost`.

    Sorted by job, domain, then tier from cheapest. `cost` is the sum of the leases'
    estimated per-request costs (0 where a row carries none).
    """
    outcomes = ",".join("?" * len(REQUEST_OUTCOMES))
    skipped = ",".join("?" * len(NO_REQUEST))
    query = (
        "SELECT t.job AS job, t.domain AS domain, COALESCE(a.tier, 'direct') AS tier, "
        "COUNT(*) AS requests, COUNT(CASE WHEN a.outcome = 'ok' THEN 1 END) AS ok, COALESCE(SUM(a.cost), 0.0) AS cost "
        "FROM attempts AS a JOIN tasks AS t ON t.id = a.task_id "
        f"WHERE (a.proxy_id IS NOT NULL OR a.outcome IN ({outcomes})) "
        f"AND COALESCE(a.outcome, '') NOT IN ({skipped}) "
    )
    params: list[Any] = [*REQUEST_OUTCOMES, *NO_REQUEST]
    if job is not None:
        query += "AND t.job = ? "
        params.append(job)
    query += "GROUP BY t.job, t.domain, COALESCE(a.tier, 'direct')"
    rows = [
        {
            "job": row["job"],
            "domain": row["domain"],
            "tier": row["tier"],
            "requests": int(row["requests"]),
            "ok": int(row["ok"] or 0),
            "cost": round(float(row["cost"]), 6),
        }
        for row in store.db.execute(query, params)
    ]
    rows.sort(key=lambda r: (r["job"], r["domain"], TIER_ORDER.get(r["tier"], 9), r["tier"]))
    return rows
