"""The API from the other side: what the CLI and `hutch.client.Client` call when
`HUTCH_API_URL` is set, so the machine they run on needs neither the store nor the broker.

Blocking (httpx's `Client`), one method per route of `hutch.services.api.routes`. Errors
come back as the API words them: `RemoteRefused` for a 4xx (its `status` and the `field`
it names), `RemoteUnavailable` when the API cannot be reached or answers 5xx. The token,
when set, goes in the `Authorization` header and nowhere else (not in a message, not in a log).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote

from hutch.settings import Settings

if TYPE_CHECKING:
    import httpx


class RemoteError(Exception):
    """What the API refused or could not do; the message says what."""


class RemoteRefused(RemoteError):
    """A 4xx: a bad value (400, `field` names it), no token (401), not found (404), a conflict (409)."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class RemoteUnavailable(RemoteError):
    """The API cannot be reached, timed out, or answered 5xx (its broker or store is down)."""


def _seg(value: str | int) -> str:
    """One path segment, escaped: a job name or task id never reaches another route."""
    return quote(str(value), safe="")


# Submitting a long file and replaying wait for every broker confirm before the answer:
# no read timeout there, or the client would give up on work that still goes through.
# (connect, read, write, pool), as httpx takes it.
_UNTIMED_READ = (30.0, None, 30.0, 30.0)


class Remote:
    def __init__(self, settings: Settings, timeout: float = 60.0) -> None:
        if not settings.api_url:
            raise ValueError("HUTCH_API_URL is not set")
        self.url = settings.api_url.rstrip("/")
        headers = {}
        if settings.api_token is not None:
            headers["Authorization"] = f"Bearer {settings.api_token.get_secret_value()}"
        # Imported here, not with the module: httpx brings its own command line's imports
        # (rich, click), about 0.1 s that every `hutch` command paid, with or without an API.
        import httpx

        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _check(self, answer: httpx.Response) -> httpx.Response:
        if answer.status_code < 400:
            return answer
        try:
            body = answer.json()
            message, field = str(body.get("error")), body.get("field")
        except (ValueError, AttributeError):
            message, field = answer.text.strip()[:300] or answer.reason_phrase, None
        if answer.status_code == 401:
            message += " (set HUTCH_API_TOKEN to the API's token)"
        if answer.status_code >= 500:
            raise RemoteUnavailable(f"the API at {self.url} answered {answer.status_code}: {message}")
        raise RemoteRefused(answer.status_code, message, field)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            answer = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteUnavailable(f"cannot reach the API at {self.url}: {type(exc).__name__}: {exc}") from None
        return self._check(answer).json()

    # -- jobs ------------------------------------------------------------------------------

    def submit(
        self,
        job: str,
        urls: list[str],
        spec: dict[str, Any] | None = None,
        tier_floor: str | None = None,
        weight: float | None = None,
    ) -> dict[str, Any]:
        body = {"job": job, "urls": urls, "spec": spec, "tier_floor": tier_floor, "weight": weight}
        return dict(self._call("POST", "/jobs", json={k: v for k, v in body.items() if v is not None}))

    def submit_file(
        self,
        job: str,
        urls: IO[bytes],
        spec_text: str | None = None,
        tier_floor: str | None = None,
        weight: float | None = None,
    ) -> dict[str, Any]:
        """A URL file, streamed from `urls` (an open binary file) as a multipart upload."""
        form = {"spec": spec_text, "tier_floor": tier_floor, "weight": None if weight is None else str(weight)}
        data = {k: v for k, v in form.items() if v is not None}
        files = {"urls": ("urls.txt", urls)}
        return dict(self._call("POST", f"/jobs/{_seg(job)}/urls", files=files, data=data, timeout=_UNTIMED_READ))

    def jobs(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/jobs"))

    def job(self, job: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/jobs/{_seg(job)}"))

    def items(self, job: str, form: str = "jsonl") -> Iterator[bytes]:
        """The job's items as the API streams them: JSON lines (or CSV rows with `form="csv"`,
        the header first), each ending in a newline."""
        import httpx

        try:
            with self.http.stream("GET", f"/jobs/{_seg(job)}/items", params={"format": form}) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    self._check(answer)
                if form != "jsonl":  # CSV may hold line breaks inside quoted cells: as it comes
                    yield from answer.iter_bytes()
                    return
                # Split on newlines only: JSON escapes every other line break, and httpx's
                # iter_lines would also split on U+2028 and U+0085 inside a string.
                rest = b""
                for chunk in answer.iter_bytes():
                    rest += chunk
                    *lines, rest = rest.split(b"\n")
                    for line in lines:
                        if line:
                            yield line + b"\n"
                if rest:
                    yield rest + b"\n"
        except httpx.HTTPError as exc:
            raise RemoteUnavailable(f"lost the API at {self.url} while reading items: {type(exc).__name__}") from None

    def delete(self, job: str) -> dict[str, int]:
        return dict(self._call("DELETE", f"/jobs/{_seg(job)}"))

    def control(
        self, job: str, action: str, weight: float | None = None, budget: float | None = None
    ) -> dict[str, Any]:
        if action == "weight":
            return dict(self._call("PUT", f"/jobs/{_seg(job)}/weight", json={"weight": weight}))
        if budget is not None:
            return dict(self._call("POST", f"/jobs/{_seg(job)}/{action}", json={"budget": budget}))
        return dict(self._call("POST", f"/jobs/{_seg(job)}/{action}"))

    # -- dead letters, domains, traces ------------------------------------------------------

    def dead(self, filters: dict[str, Any], limit: int | None = None) -> dict[str, Any]:
        params = {k: v for k, v in filters.items() if v is not None}
        if limit is not None:
            params["limit"] = limit
        return dict(self._call("GET", "/dead", params=params))

    def dead_entry(self, entry_id: int) -> dict[str, Any]:
        return dict(self._call("GET", f"/dead/{_seg(entry_id)}"))

    def replay(self, filters: dict[str, Any], reset_attempts: bool) -> dict[str, int]:
        body = {**filters, "reset_attempts": reset_attempts}
        return dict(self._call("POST", "/dead/replay", json=body, timeout=_UNTIMED_READ))

    def purge(self, filters: dict[str, Any]) -> int:
        body = {k: v for k, v in filters.items() if v is not None} or {"all": True}
        return int(self._call("POST", "/dead/purge", json=body)["purged"])

    def domains(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("GET", "/domains", params={k: v for k, v in params.items() if v is not None}))

    def trace(self, task_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/tasks/{_seg(task_id)}/trace"))
