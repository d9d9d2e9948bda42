"""The deployment files agree with the code: service names, settings, queue names, image.

No cluster runs here, so the Kubernetes manifests are only parsed (PyYAML) and held to what
Hutch itself defines: `hutch.services.SERVICES`, the `Settings` fields and the topology's
queue names. The RabbitMQ cluster config and the Dockerfile get the same kind of check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hutch.metrics import SERIES
from hutch.services import SERVICES
from hutch.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def manifests() -> list[Manifest]:
    found: list[Manifest] = []
    for path in sorted(K8S.glob("*.yaml")):
        with path.open(encoding="utf-8") as handle:
            for document in yaml.safe_load_all(handle):
                if document is not None:
                    document["__file__"] = path.name
                    found.append(document)
    return found


def _of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def _one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [m for m in _of_kind(manifests, kind) if name is None or m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _deployments(manifests: list[Manifest]) -> dict[str, Manifest]:
    return {m["metadata"]["name"]: m for m in _of_kind(manifests, "Deployment")}


def _container(deployment: Manifest) -> Manifest:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def _settings_data(manifests: list[Manifest]) -> dict[str, Any]:
    return _one(manifests, "ConfigMap", "hutch-settings")["data"]  # type: ignore[no-any-return]


def test_the_manifests_hold_the_expected_kinds(manifests: list[Manifest]) -> None:
    kinds = sorted(m["kind"] for m in manifests)
    assert kinds == sorted(
        [
            "Namespace",
            "ConfigMap",
            *["Deployment"] * len(SERVICES),
            "PersistentVolumeClaim",
            "ScaledObject",
            "ScaledObject",
            "Kustomization",
        ]
    )


def test_every_namespaced_resource_is_in_the_hutch_namespace(manifests: list[Manifest]) -> None:
    namespace = _one(manifests, "Namespace")["metadata"]["name"]
    for m in manifests:
        if m["kind"] not in ("Namespace", "Kustomization"):
            assert m["metadata"]["namespace"] == namespace, (m["kind"], m["metadata"]["name"])


def test_the_kustomization_lists_every_manifest_file(manifests: list[Manifest]) -> None:
    resources = _one(manifests, "Kustomization")["resources"]
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(resources) == sorted(files)


def test_every_service_has_a_deployment_running_hutch_serve_with_its_name(
    manifests: list[Manifest],
) -> None:
    deployments = _deployments(manifests)
    assert sorted(deployments) == sorted(SERVICES)
    for name, deployment in deployments.items():
        container = _container(deployment)
        assert [*container["command"], *container["args"]] == ["hutch", "serve", name]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items(), name


def test_every_deployment_runs_the_same_image_as_a_non_root_user(manifests: list[Manifest]) -> None:
    deployments = _deployments(manifests)
    images = {_container(d)["image"] for d in deployments.values()}
    assert len(images) == 1, images
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name


def test_settings_come_from_the_configmap_and_the_broker_url_from_a_secret(
    manifests: list[Manifest],
) -> None:
    for name, deployment in _deployments(manifests).items():
        container = _container(deployment)
        assert {"configMapRef": {"name": "hutch-settings"}} in container["envFrom"], name
        env = {e["name"]: e for e in container["env"]}
        assert "value" not in env["HUTCH_AMQP_URL"], f"{name}: broker credentials written in clear"
        assert env["HUTCH_AMQP_URL"]["valueFrom"]["secretKeyRef"]["key"] == "HUTCH_AMQP_URL"


def test_the_configmap_holds_only_known_settings_as_strings(manifests: list[Manifest]) -> None:
    data = _settings_data(manifests)
    fields = {f"HUTCH_{field.upper()}" for field in Settings.model_fields}
    assert {key for key in data if key.startswith("HUTCH_")} <= fields
    assert "HUTCH_AMQP_URL" not in data
    # Kubernetes refuses a ConfigMap whose values are not strings (an unquoted 10, say).
    assert all(isinstance(value, str) for value in data.values())
    Settings(**{key.removeprefix("HUTCH_").lower(): v for key, v in data.items() if key.startswith("HUTCH_")})


def test_a_cluster_deployment_declares_quorum_queues(manifests: list[Manifest]) -> None:
    assert _settings_data(manifests)["HUTCH_QUEUE_TYPE"] == "quorum"


def _series_named(query: str) -> set[str]:
    return set(re.findall(r"\b(hutch_[a-z_]+|rabbitmq_[a-z_]+)", query))


def test_fetchers_scale_on_the_slots_wanted_one_pod_per_fetchers_concurrency(manifests: list[Manifest]) -> None:
    data = _settings_data(manifests)
    scaled = _one(manifests, "ScaledObject", "fetcher")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "fetcher"
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus"
    assert _series_named(trigger["metadata"]["query"]) == {"hutch_fetch_slots_wanted"}
    assert trigger["metadata"]["threshold"] == data["HUTCH_CONCURRENCY"]


def test_parsers_scale_on_the_depth_of_the_parse_queue(manifests: list[Manifest]) -> None:
    scaled = _one(manifests, "ScaledObject", "parser")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "parser"
    (trigger,) = scaled["triggers"]
    assert trigger["metadata"]["query"] == 'max(hutch_queue_depth{queue="parse"})'
    assert "replicas" not in _deployments(manifests)["parser"]["spec"]


# The prometheus trigger's metadata, as KEDA's documentation lists it (keda.sh, "Prometheus"
# scaler, v2.13): a field outside this set is ignored by KEDA, silently.
KEDA_PROMETHEUS_FIELDS = {
    "serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
    "customHeaders", "ignoreNullValues", "unsafeSsl",
}


def test_every_scaler_trigger_uses_known_fields_and_names_series_hutch_exports(manifests: list[Manifest]) -> None:
    for scaled in _of_kind(manifests, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            metadata = trigger["metadata"]
            assert set(metadata) <= KEDA_PROMETHEUS_FIELDS, set(metadata) - KEDA_PROMETHEUS_FIELDS
            assert {"serverAddress", "query", "threshold"} <= set(metadata)
            assert all(isinstance(v, str) for v in metadata.values())  # KEDA's metadata is a string map
            assert _series_named(metadata["query"]) <= set(SERIES)


def test_every_deployment_serves_its_metrics_port_with_probes(manifests: list[Manifest]) -> None:
    data = _settings_data(manifests)
    assert data["HUTCH_METRICS_HOST"] == "0.0.0.0"
    defaults = Settings()
    for name, deployment in _deployments(manifests).items():
        container = _container(deployment)
        (port,) = container["ports"]
        assert port == {"name": "metrics", "containerPort": defaults.metrics_port(name)}, name
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, name
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, name


def test_the_prometheus_files_name_only_series_that_exist() -> None:
    prometheus = DEPLOY / "prometheus"
    for path in [*prometheus.glob("*.yml"), DEPLOY / "grafana" / "hutch.json"]:
        named = {n for n in _series_named(path.read_text()) if n.startswith("hutch_")}
        exported = {n for n in named if n in SERIES or n.rsplit("_", 1)[0] in SERIES}
        assert named == exported, (path.name, named - exported)


def test_the_kubernetes_scrape_keeps_the_pods_and_port_the_manifests_define(manifests: list[Manifest]) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())
    (hutch,) = [job for job in config["scrape_configs"] if job["job_name"] == "hutch"]
    keep = {r["source_labels"][0]: r["regex"] for r in hutch["relabel_configs"] if r.get("action") == "keep"}
    assert keep == {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "hutch",
        "__meta_kubernetes_pod_container_port_name": "metrics",
    }
    namespace = _one(manifests, "Namespace")["metadata"]["name"]
    assert hutch["kubernetes_sd_configs"][0]["namespaces"]["names"] == [namespace]
    for deployment in _deployments(manifests).values():
        assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "hutch"


def test_the_fetcher_deployment_has_resources_and_leaves_its_count_to_the_scaler(
    manifests: list[Manifest],
) -> None:
    fetcher = _deployments(manifests)["fetcher"]
    assert "replicas" not in fetcher["spec"]
    resources = _container(fetcher)["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]


def test_the_storer_keeps_its_sqlite_file_on_a_claim_with_one_writer(manifests: list[Manifest]) -> None:
    storer = _deployments(manifests)["storer"]
    assert storer["spec"]["replicas"] == 1
    assert storer["spec"]["strategy"]["type"] == "Recreate"
    pod = storer["spec"]["template"]["spec"]
    (mount,) = _container(storer)["volumeMounts"]
    assert mount["mountPath"] == _settings_data(manifests)["HUTCH_DATA_DIR"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    _one(manifests, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])


def test_the_rabbitmq_cluster_config_forms_a_cluster_and_says_to_use_quorum_queues() -> None:
    text = (DEPLOY / "rabbitmq" / "rabbitmq.conf").read_text(encoding="utf-8")
    settings = dict(
        (key.strip(), value.strip())
        for key, _, value in (
            line.partition("=") for line in text.splitlines() if line.strip() and not line.startswith("#")
        )
    )
    assert settings["cluster_formation.peer_discovery_backend"] == "rabbit_peer_discovery_k8s"
    assert settings["cluster_partition_handling"] == "pause_minority"
    assert "HUTCH_QUEUE_TYPE=quorum" in text
    plugins = (DEPLOY / "rabbitmq" / "enabled_plugins").read_text(encoding="utf-8")
    assert "rabbitmq_peer_discovery_k8s" in plugins
    assert plugins.strip().endswith("].")


def test_the_dockerfile_builds_one_non_root_image_whose_entrypoint_is_hutch() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    instructions = [line for line in text.splitlines() if line and not line.startswith(("#", " "))]
    assert instructions[0] == "FROM python:3.11-slim AS build"
    assert [i for i in instructions if i.startswith("FROM")][-1] == "FROM python:3.11-slim"
    users = [i.split()[1] for i in instructions if i.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert 'ENTRYPOINT ["hutch"]' in instructions
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if not line.startswith("#")}
    for copy in (i for i in instructions if i.startswith("COPY ") and "--from=" not in i):
        for source in copy.split()[1:-1]:
            assert (ROOT / source).exists(), f"{copy}: {source} is not in the repository"
            assert source not in ignored, f"{copy}: {source} is excluded by .dockerignore"
    assert re.search(r"^\.venv$", "\n".join(ignored), re.MULTILINE)
