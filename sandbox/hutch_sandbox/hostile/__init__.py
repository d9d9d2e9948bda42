"""The hostile site: answers the open web gives, each on a fixed path, for the bad-input tests.

Every sandbox site serves `/hostile/<name>`; `<name>` picks one answer from `ROUTES`, which the
modules of this package fill by kind of trouble (bodies and encodings, URLs and redirects, page
structure). Each answer is the same on every request, so a test asks for exactly the trouble it
wants and checks where the task ended and why.
"""

from __future__ import annotations

from collections.abc import Callable

from hutch_sandbox.site import Outcome

# name -> answer(query) for `/hostile/<name>?<query>`
Route = Callable[[dict[str, str]], Outcome]
ROUTES: dict[str, Route] = {}


def route(name: str) -> Callable[[Route], Route]:
    """Register an answer under `/hostile/<name>`."""

    def register(answer: Route) -> Route:
        if name in ROUTES:
            raise ValueError(f"hostile route {name!r} registered twice")
        ROUTES[name] = answer
        return answer

    return register


def answer(name: str, query: dict[str, str]) -> Outcome | None:
    """The answer for `/hostile/<name>`, or None for a name no module registered."""
    _load()
    found = ROUTES.get(name)
    return None if found is None else found(query)


def _load() -> None:
    # Imported here, not at the top: the route modules import the site's reply types.
    from hutch_sandbox.hostile import bodies, pages, urls  # noqa: F401
