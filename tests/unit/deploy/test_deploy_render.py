"""Every overlay of deploy/k8s renders, and every object it renders is valid Kubernetes: the
built-in kinds against the API's schemas (strict: an unknown field fails), the custom ones
(KEDA, Prometheus Operator) for what they point at."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest

from mesh.ingress.metrics import IngressMetrics
from proto_msgs.messages import BrokerStats
from tests.unit.deploy.k8s_objects import (
    OVERLAYS,
    Container,
    containers,
    find,
    launch_flags,
    selects,
)

CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}
# The oldest Kubernetes still commonly run, and the newest the schemas know.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def test_the_overlays_are_the_ones_the_guide_names() -> None:
    assert set(OVERLAYS) == {"cpu", "gpu", "multi-model", "two-brokers"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_a_whole_fleet(renders: dict, overlay: str) -> None:
    objects = renders[overlay]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for needed in [("Deployment", "broker"), ("Service", "broker"), ("Deployment", "worker"),
                   ("Deployment", "ingress"), ("Service", "ingress"),
                   ("HorizontalPodAutoscaler", "ingress")]:  # fmt: skip
        assert needed in kinds, f"overlays/{overlay} renders no {needed}"
    roles = {c.role(launch_flags()) for c in containers(objects) if c.runs_mesh_launch}
    assert roles == {"broker", "worker", "ingress"}


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(
    renders: dict, overlay: str, version: str
) -> None:
    for obj in renders[overlay]:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"overlays/{overlay}: {obj['kind']}/{obj['metadata']['name']}: {exc}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_keda_and_prometheus_operator_kinds_lack_a_schema(renders: dict, overlay: str) -> None:
    for obj in renders[overlay]:
        try:
            kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS, obj["kind"]


def _exported_metric_names() -> set[str]:
    """The series names the ingress's /metrics serves, with every labelled family touched."""

    class Link:
        endpoint, alive, outstanding_tokens, failovers = "tcp://broker:5555", True, 0, 0
        stats = BrokerStats(queued_tokens={"m": 1}, queued_sequences={"m": 1}, workers={"m": 1})

        def heard_ago(self) -> float:
            return 0.5

    client = SimpleNamespace(brokers=[Link()])  # what BrokerCollector reads of a MeshClient
    metrics = IngressMetrics(client)  # type: ignore[arg-type]
    metrics.prompt_tokens.labels("m").inc()
    text = metrics.render().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def _scaled_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "ScaledObject"]


def _served_model(worker: Container) -> str:
    models = worker.option(launch_flags(), "--model")
    return models[-1].rstrip("/").rsplit("/", 1)[-1] if models else "all-MiniLM-L6-v2"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scaled_workers_scale_on_metrics_the_ingress_exports_for_their_model(
    renders: dict, overlay: str
) -> None:
    exported = _exported_metric_names()
    for scaled in _scaled_objects(renders[overlay]):
        target = find(renders[overlay], "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        (worker,) = [c for c in containers([target], init=False)]
        assert worker.role(launch_flags()) == "worker"
        for trigger in scaled["spec"]["triggers"]:
            query = trigger["metadata"]["query"]
            names = set(re.findall(r"\b(embedmesh_[a-z_]+)", query))
            assert names and names <= exported, f"{names - exported} is not exported"
            assert set(re.findall(r'model="([^"]+)"', query)) == {_served_model(worker)}
            assert float(trigger["metadata"]["threshold"]) > 0


def test_the_gpu_fleet_scales_its_workers_with_keda(renders: dict) -> None:
    assert [s["metadata"]["name"] for s in _scaled_objects(renders["gpu"])] == ["worker"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_service_monitor_scrapes_the_ingress_metrics_port(renders: dict, overlay: str) -> None:
    monitors = [o for o in renders[overlay] if o["kind"] == "ServiceMonitor"]
    for monitor in monitors:
        services = [
            o for o in renders[overlay]
            if o["kind"] == "Service"
            and selects(monitor["spec"]["selector"]["matchLabels"], o["metadata"]["labels"])
        ]  # fmt: skip
        assert [s["metadata"]["name"] for s in services] == ["ingress"]
        ports = {p["name"] for p in services[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
        assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}
