"""New tasks as frontier messages (`hutch.frontier.frontier_messages`): a domain's together, a few to a message."""

from __future__ import annotations

from hutch.frontier import PER_MESSAGE, frontier_messages
from hutch.models import Parked, Task, task_id


def task(domain: str, n: int) -> Task:
    url = f"http://{domain}/{n}"
    return Task(id=task_id("job", url), job="job", url=url, domain=domain)


def test_each_domains_tasks_go_as_one_parked_in_the_order_given_and_a_lone_task_as_itself() -> None:
    tasks = [task("a.test", 0), task("b.test", 0), task("a.test", 1), task("c.test", 0), task("a.test", 2),
             task("b.test", 1)]
    messages = list(frontier_messages(tasks))
    assert [type(m) for m in messages] == [Parked, Parked, Task]
    a, b, c = messages
    assert isinstance(a, Parked) and [t.url for t in a.tasks] == [f"http://a.test/{n}" for n in range(3)]
    assert isinstance(b, Parked) and [t.url for t in b.tasks] == ["http://b.test/0", "http://b.test/1"]
    assert isinstance(c, Task) and c.url == "http://c.test/0"


def test_a_domain_with_more_than_a_parked_holds_goes_in_several_and_none_is_lost() -> None:
    tasks = [task("big.test", n) for n in range(2 * PER_MESSAGE + 1)]
    messages = list(frontier_messages(tasks))
    assert [len(m.tasks) if isinstance(m, Parked) else 1 for m in messages] == [PER_MESSAGE, PER_MESSAGE, 1]
    out = [t for m in messages for t in (m.tasks if isinstance(m, Parked) else [m])]
    assert out == tasks


def test_no_tasks_no_messages() -> None:
    assert list(frontier_messages([])) == []


def test_not_together_each_task_goes_as_itself() -> None:
    tasks = [task("a.test", 0), task("a.test", 1)]
    assert list(frontier_messages(tasks, together=False)) == tasks
