"""Choosing how to get a broker: every branch of `plan`, and no password in what it says.

`plan` is pure (a `Machine` description in, a `Plan` out), so each situation a user can be
in is one case here; `ensure` only carries the plan out.
"""

from __future__ import annotations

import pytest

from hutch.services.control.broker import Machine, Plan, plan

LOCAL = "amqp://admin:s3cret-pw@127.0.0.1:5672/"
REMOTE = "amqp://admin:s3cret-pw@rabbit.example.com:5672/prod"


def machine(
    reachable: bool = False,
    local_url: bool = True,
    has_server: bool = False,
    has_docker_engine: bool = False,
    debian_root: bool = False,
    has_chrt: bool = False,
) -> Machine:
    return Machine(reachable, local_url, has_server, has_docker_engine, debian_root, has_chrt)


def test_a_reachable_broker_is_used_as_it_is_whatever_else_the_machine_has() -> None:
    everything = machine(reachable=True, has_server=True, has_docker_engine=True, debian_root=True)
    for url, where in ((LOCAL, everything), (REMOTE, machine(reachable=True, local_url=False))):
        chosen = plan(where, url)
        assert chosen.action == "use"
        assert chosen.commands == ()
        assert "reachable" in chosen.message


def test_an_unreachable_remote_broker_is_left_to_the_user_even_when_one_could_start_here() -> None:
    chosen = plan(machine(local_url=False, has_server=True, has_docker_engine=True, debian_root=True), REMOTE)
    assert chosen.action == "manual"
    assert chosen.commands == ()
    assert "rabbit.example.com:5672" in chosen.message
    assert "HUTCH_AMQP_URL" in chosen.message


def test_an_installed_local_server_is_started_before_docker_or_apt_are_tried() -> None:
    chosen = plan(machine(has_server=True, has_docker_engine=True, debian_root=True), LOCAL)
    assert chosen == Plan("start-local", (("rabbitmq-server", "-detached"),), chosen.message)


def test_a_broker_started_here_runs_sched_batch_where_chrt_is_installed() -> None:
    started = plan(machine(has_server=True, has_chrt=True), LOCAL)
    assert started.commands == (("chrt", "--batch", "0", "rabbitmq-server", "-detached"),)
    installed = plan(machine(debian_root=True, has_chrt=True), LOCAL)
    assert installed.commands[-1] == ("chrt", "--batch", "0", "rabbitmq-server", "-detached")
    # Docker's broker and one already running are not this command's to change.
    assert plan(machine(has_docker_engine=True, has_chrt=True), LOCAL).commands == (
        ("docker", "compose", "up", "-d", "rabbitmq"),
    )
    assert plan(machine(reachable=True, has_server=True, has_chrt=True), LOCAL).commands == ()


def test_without_a_server_a_running_docker_engine_starts_the_compose_service() -> None:
    chosen = plan(machine(has_docker_engine=True, debian_root=True), LOCAL)
    assert chosen.action == "docker"
    assert chosen.commands == (("docker", "compose", "up", "-d", "rabbitmq"),)


def test_on_debian_as_root_rabbitmq_is_installed_with_apt_and_started() -> None:
    chosen = plan(machine(debian_root=True), LOCAL)
    assert chosen.action == "install"
    assert chosen.commands == (
        ("apt-get", "update"),
        ("apt-get", "install", "-y", "rabbitmq-server"),
        ("rabbitmq-server", "-detached"),
    )


def test_with_no_way_to_get_a_broker_the_user_is_told_every_way_to_get_one() -> None:
    chosen = plan(machine(), LOCAL)
    assert chosen.action == "manual"
    assert chosen.commands == ()
    assert "install RabbitMQ" in chosen.message
    assert "docker compose up -d rabbitmq" in chosen.message
    assert "HUTCH_AMQP_URL" in chosen.message


@pytest.mark.parametrize(
    "where",
    [
        machine(reachable=True),
        machine(reachable=True, local_url=False),
        machine(local_url=False),
        machine(has_server=True),
        machine(has_docker_engine=True),
        machine(debian_root=True),
        machine(),
    ],
)
@pytest.mark.parametrize("url", [LOCAL, REMOTE])
def test_no_plan_shows_the_password(where: Machine, url: str) -> None:
    chosen = plan(where, url)
    shown = chosen.message + " ".join(" ".join(command) for command in chosen.commands)
    assert "s3cret-pw" not in shown
    assert chosen.message
