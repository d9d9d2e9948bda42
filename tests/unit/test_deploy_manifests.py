"""The deployment files agree with the code: service names, settings, queue names, image.

No cluster runs here, so the Kubernetes manifests are rendered as `kubectl kustomize` renders
each overlay (deploy/k8s/overlays/single-node and cluster, both on deploy/k8s/base), then held
to what Hutch itself defines (`hutch.services`, the `Settings` fields, the metrics series),
their built-in kinds to Kubernetes' own schemas (the `kubernetes-validate` package, which
ships them), and their custom resources (KEDA, the RabbitMQ Cluster Operator), whose schemas
no package here ships, to the fields those operators document. The RabbitMQ cluster config
and the Dockerfile get the same kind of check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
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
OVERLAYS = ("single-node", "cluster")
# The Kubernetes version the built-in kinds are validated against (kubectl here is 1.32).
KUBERNETES = "1.32.0"

Manifest = dict[str, Any]


def render(overlay: str) -> list[Manifest]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        message = "kubectl is not installed (Debian's kubectl renders the kustomizations)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [document for document in yaml.safe_load_all(done.stdout) if document]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def manifests(overlay: str) -> list[Manifest]:
    return render(overlay)


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


def test_the_manifests_hold_the_expected_kinds(manifests: list[Manifest], overlay: str) -> None:
    kinds = sorted(m["kind"] for m in manifests)
    common = [
        "Namespace",
        "ConfigMap",
        *["Deployment"] * (len(SERVICES) + 1),  # the services and the API
        "Service",  # the API's
        *["PodDisruptionBudget"] * 3,
        *["ScaledObject"] * 2,
        "RabbitmqCluster",
    ]
    own = {"single-node": ["StatefulSet", "Service"], "cluster": []}[overlay]  # PostgreSQL, or a managed one
    assert kinds == sorted(common + own)
    assert not _of_kind(manifests, "Secret")  # credentials are never in the repository


def test_every_namespaced_resource_is_in_the_hutch_namespace(manifests: list[Manifest]) -> None:
    namespace = _one(manifests, "Namespace")["metadata"]["name"]
    for m in manifests:
        if m["kind"] != "Namespace":
            assert m["metadata"]["namespace"] == namespace, (m["kind"], m["metadata"]["name"])


def test_each_kustomization_lists_every_manifest_file_of_its_folder() -> None:
    for folder in (K8S / "base", *(K8S / "overlays" / o for o in OVERLAYS)):
        resources = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
        files = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
        assert sorted(r for r in resources if not r.startswith("..")) == sorted(files), folder
        if folder.name != "base":
            assert "../../base" in resources, folder


def test_every_service_has_a_deployment_running_hutch_serve_with_its_name(
    manifests: list[Manifest],
) -> None:
    deployments = _deployments(manifests)
    assert sorted(deployments) == sorted((*SERVICES, "api"))
    for name, deployment in deployments.items():
        container = _container(deployment)
        assert [*container["command"], *container["args"]] == ["hutch", "serve", name]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items(), name


def test_every_deployment_runs_the_same_image_as_a_non_root_user(manifests: list[Manifest]) -> None:
    deployments = _deployments(manifests)
    images = {_container(d)["image"] for d in deployments.values()}
    assert len(images) == 1, images
    for name, deployment in [
        *deployments.items(),
        *((s["metadata"]["name"], s) for s in _of_kind(manifests, "StatefulSet")),
    ]:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name


# Which Secret holds each credential a container is given.
SECRETS = {"HUTCH_AMQP_URL": "hutch-amqp", "HUTCH_STORE_URL": "hutch-store", "HUTCH_API_TOKEN": "hutch-api"}


def test_settings_come_from_the_configmap_and_every_credential_from_a_secret(manifests: list[Manifest]) -> None:
    fields = {f"HUTCH_{field.upper()}" for field in Settings.model_fields}
    for name, deployment in _deployments(manifests).items():
        container = _container(deployment)
        assert {"configMapRef": {"name": "hutch-settings"}} in container["envFrom"], name
        env = {e["name"]: e for e in container["env"]}
        assert {key for key in env if key.startswith("HUTCH_")} <= fields, name
        assert "HUTCH_AMQP_URL" in env, name
        for key, secret in SECRETS.items():
            if key in env:
                assert "value" not in env[key], f"{name}: {key} written in clear"
                assert env[key]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}, name
    deployments = _deployments(manifests)
    assert {e["name"] for e in _container(deployments["storer"])["env"]} >= {"HUTCH_STORE_URL"}
    assert {e["name"] for e in _container(deployments["api"])["env"]} >= {"HUTCH_STORE_URL", "HUTCH_API_TOKEN"}


def test_the_configmap_holds_only_known_settings_as_strings(manifests: list[Manifest]) -> None:
    data = _settings_data(manifests)
    fields = {f"HUTCH_{field.upper()}" for field in Settings.model_fields}
    assert {key for key in data if key.startswith("HUTCH_")} <= fields
    assert "HUTCH_AMQP_URL" not in data
    # Kubernetes refuses a ConfigMap whose values are not strings (an unquoted 10, say).
    assert all(isinstance(value, str) for value in data.values())
    Settings(**{key.removeprefix("HUTCH_").lower(): v for key, v in data.items() if key.startswith("HUTCH_")})


def test_the_queue_type_follows_the_broker_classic_on_one_node_quorum_on_three(
    manifests: list[Manifest], overlay: str
) -> None:
    replicas = _one(manifests, "RabbitmqCluster")["spec"]["replicas"]
    queue_type = _settings_data(manifests)["HUTCH_QUEUE_TYPE"]
    assert (replicas, queue_type) == {"single-node": (1, "classic"), "cluster": (3, "quorum")}[overlay]


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
    "serverAddress",
    "query",
    "queryParameters",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
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
        if name == "api":  # the API serves its probes and /metrics on its own port
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert port == {"name": "http", "containerPort": int(env["HUTCH_API_PORT"])}
            assert env["HUTCH_API_PORT"] == str(defaults.api_port) and env["HUTCH_API_HOST"] == "0.0.0.0"
        else:
            assert port == {"name": "metrics", "containerPort": defaults.metrics_port(name)}, name
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}, name
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}, name
    service = _one(manifests, "Service", "api")["spec"]
    assert service["selector"].items() <= deployment_labels(manifests, "api").items()
    assert service["ports"] == [{"name": "http", "port": defaults.api_port, "targetPort": "http"}]


def deployment_labels(manifests: list[Manifest], name: str) -> dict[str, str]:
    return _deployments(manifests)[name]["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


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


def test_the_storer_writes_to_postgresql_and_keeps_nothing_on_a_volume_of_its_own(manifests: list[Manifest]) -> None:
    storer = _deployments(manifests)["storer"]
    assert storer["spec"]["replicas"] == 1
    assert not _of_kind(manifests, "PersistentVolumeClaim")
    volumes = storer["spec"]["template"]["spec"]["volumes"]
    assert all("emptyDir" in volume for volume in volumes)


def test_governors_proxy_managers_and_the_api_run_two_and_keep_one_through_a_drain(manifests: list[Manifest]) -> None:
    budgets = {m["metadata"]["name"]: m["spec"] for m in _of_kind(manifests, "PodDisruptionBudget")}
    assert sorted(budgets) == ["api", "governor", "proxy-manager"]
    for name, budget in budgets.items():
        assert _deployments(manifests)[name]["spec"]["replicas"] == 2, name
        assert budget["minAvailable"] == 1, name
        assert budget["selector"]["matchLabels"].items() <= deployment_labels(manifests, name).items(), name


def test_every_built_in_kind_passes_the_kubernetes_schemas(manifests: list[Manifest]) -> None:
    import kubernetes_validate

    for m in manifests:
        if m["apiVersion"].startswith(("keda.sh/", "rabbitmq.com/")):
            continue
        kubernetes_validate.validate(m, KUBERNETES, strict=True)


# Fields of the custom resources as their operators document them; a misspelt field of a
# custom resource is kept by Kubernetes and ignored by its operator, silently.
# RabbitmqCluster (rabbitmq.com/v1beta1): the Cluster Operator's API reference and its
# examples (github.com/rabbitmq/cluster-operator, api/v1beta1/rabbitmqcluster_types.go,
# docs/examples/production-ready): the spec fields below are a subset of it.
RABBITMQ_CLUSTER_FIELDS = {
    "spec": {
        "replicas",
        "image",
        "imagePullSecrets",
        "service",
        "persistence",
        "resources",
        "affinity",
        "tolerations",
        "rabbitmq",
        "override",
        "tls",
        "terminationGracePeriodSeconds",
    },
    "persistence": {"storageClassName", "storage"},
    "rabbitmq": {"additionalConfig", "advancedConfig", "envConfig", "additionalPlugins"},
}
# ScaledObject (keda.sh/v1alpha1): keda.sh, "Scaling Deployments, StatefulSets & Custom
# Resources", the ScaledObject specification (v2.13).
SCALED_OBJECT_FIELDS = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}


def test_the_custom_resources_use_only_fields_their_operators_document(manifests: list[Manifest]) -> None:
    rabbit = _one(manifests, "RabbitmqCluster")
    assert rabbit["apiVersion"] == "rabbitmq.com/v1beta1"
    spec = rabbit["spec"]
    assert set(spec) <= RABBITMQ_CLUSTER_FIELDS["spec"], set(spec) - RABBITMQ_CLUSTER_FIELDS["spec"]
    assert set(spec["persistence"]) <= RABBITMQ_CLUSTER_FIELDS["persistence"]
    assert set(spec["rabbitmq"]) <= RABBITMQ_CLUSTER_FIELDS["rabbitmq"]
    assert spec["image"] == "rabbitmq:3.10.8-management"  # the version the tests ran on
    for line in spec["rabbitmq"].get("additionalConfig", "").splitlines():
        key, equals, _ = line.partition("=")
        assert equals and re.fullmatch(r"[a-z_.]+", key.strip()), line  # rabbitmq.conf lines
    for scaled in _of_kind(manifests, "ScaledObject"):
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        assert set(scaled["spec"]) <= SCALED_OBJECT_FIELDS, set(scaled["spec"]) - SCALED_OBJECT_FIELDS
        assert scaled["spec"]["scaleTargetRef"]["name"] in _deployments(manifests)


def _erlang_terms(text: str) -> str:
    """Erlang terms with `%%` comments and all white space dropped (no string in them has any)."""
    return re.sub(r"\s+", "", "\n".join(line.split("%")[0] for line in text.splitlines()))


def test_the_cluster_overlay_gives_rabbitmq_the_advanced_config_in_deploy() -> None:
    shipped = (DEPLOY / "rabbitmq" / "advanced.config").read_text(encoding="utf-8")
    given = _one(render("cluster"), "RabbitmqCluster")["spec"]["rabbitmq"]["advancedConfig"]
    assert _erlang_terms(given) == _erlang_terms(shipped)
    # A quorum tier's dead letter lost in a failover is resent within seconds, not 180 s.
    assert "{dead_letter_worker_publisher_confirm_timeout,10000}" in _erlang_terms(shipped)


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
