"""What the rendered manifests tell mesh-launch holds together: every flag exists and applies
to its container's role, every Secret, ConfigMap, key file and port it names is there, and
the ingress's termination grace covers its drain."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import click
import pytest

from tests.unit.deploy.k8s_objects import (
    OVERLAYS,
    Container,
    containers,
    endpoint_port,
    launch_flags,
    launch_module,
    pod_spec,
    projected_files,
    selects,
)

# What each role's --curve-dir must hold (docs/serving.md): its own pair, and the broker's
# public key for a client, the clients' public keys (its allow-list) for the broker.
CURVE_FILES = {
    "broker": {"broker.key", "broker.key_secret", "ingress.key", "worker.key"},
    "worker": {"worker.key", "worker.key_secret", "broker.key"},
    "ingress": {"ingress.key", "ingress.key_secret", "broker.key"},
}
LISTENS = {"broker": ("--frontend", "--backend"), "ingress": ("--http-port",)}


def _launched(objects: list[dict[str, Any]]) -> list[Container]:
    return [c for c in containers(objects) if c.runs_mesh_launch]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_flag_exists_in_mesh_launch_and_applies_to_the_containers_role(
    renders: dict, overlay: str
) -> None:
    flags = launch_flags()
    for container in _launched(renders[overlay]):
        role = container.role(flags)
        for name, value in container.options(flags):
            assert name in flags, f"{container.where}: mesh-launch has no {name}"
            assert role in flags[name].roles, f"{container.where}: {name} is not for --role {role}"
            assert (value is not None) == flags[name].takes_value, f"{container.where}: {name}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_and_config_map_a_pod_names_is_rendered(renders: dict, overlay: str) -> None:
    objects = renders[overlay]
    for obj in objects:
        pod = pod_spec(obj)
        for volume in (pod or {}).get("volumes", []):
            if "secret" in volume or "configMap" in volume:
                files = projected_files(volume, objects)  # finds the object, or fails
                assert files, f"{obj['metadata']['name']}: volume {volume['name']} is empty"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_workload_selects_its_own_pods_and_no_others(renders: dict, overlay: str) -> None:
    workloads = [o for o in renders[overlay] if pod_spec(o) is not None]
    for workload in workloads:
        selector = workload["spec"]["selector"]["matchLabels"]
        chosen = [
            w["metadata"]["name"] for w in workloads
            if selects(selector, w["spec"]["template"]["metadata"]["labels"])
        ]  # fmt: skip
        assert chosen == [workload["metadata"]["name"]], f"{workload['metadata']['name']}: {chosen}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_role_mounts_the_curve_keys_it_needs_and_no_other_secret(
    renders: dict, overlay: str
) -> None:
    flags = launch_flags()
    for container in _launched(renders[overlay]):
        (curve_dir,) = container.option(flags, "--curve-dir")
        mounted = container.volume_at(curve_dir)
        assert mounted is not None, f"{container.where}: nothing mounted at {curve_dir}"
        volume, inside = mounted
        assert inside == "" and "secret" in volume, f"{container.where}: {curve_dir}"
        files = projected_files(volume, renders[overlay])
        assert set(files) == CURVE_FILES[container.role(flags)], container.where
        for name, text in files.items():
            # zmq's certificate files: a public key in each, a secret one only in *_secret.
            assert "public-key" in text
            assert ("secret-key" in text) == name.endswith("_secret"), f"{container.where}: {name}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_key_file_is_a_mounted_secret_key(renders: dict, overlay: str) -> None:
    flags = launch_flags()
    ingresses = [c for c in _launched(renders[overlay]) if c.role(flags) == "ingress"]
    assert ingresses
    for container in ingresses:
        (path,) = container.option(flags, "--api-key-file")
        volume, inside = container.volume_at(path) or ({}, "")
        assert "secret" in volume, f"{container.where}: {path} is not on a Secret"
        assert projected_files(volume, renders[overlay])[inside].strip()


def _listening_ports(container: Container) -> set[int]:
    """The TCP ports its mesh-launch binds, from its flags (or their defaults)."""
    flags, role = launch_flags(), container.role(launch_flags())
    ports = set()
    for flag in LISTENS.get(role, ()):
        values = container.option(flags, flag)
        assert values, f"{container.where}: {flag} left to its loopback default"
        ports.add(int(values[-1]) if flag == "--http-port" else endpoint_port(values[-1])[1])
    return ports


def _probe_ports(container: Container) -> list[int | str]:
    found = []
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        action = container.spec.get(probe, {})
        for kind in ("httpGet", "tcpSocket"):
            if kind in action:
                found.append(action[kind]["port"])
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_declared_and_probed_port_is_one_the_container_listens_on(
    renders: dict, overlay: str
) -> None:
    for container in _launched(renders[overlay]):
        listens = _listening_ports(container)
        declared = {int(p["containerPort"]) for p in container.spec.get("ports", [])}
        assert declared == listens, f"{container.where}: ports {declared}, listens on {listens}"
        for ref in _probe_ports(container):
            assert container.port(ref) in listens, f"{container.where}: probe on {ref}"
        annotations = container.owner["spec"]["template"]["metadata"].get("annotations", {})
        if "prometheus.io/port" in annotations:
            assert int(annotations["prometheus.io/port"]) in listens


def _service_backends(objects: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[str, int]]:
    """(Service name, port) -> (role of the one container behind it, its container port)."""
    flags = launch_flags()
    out = {}
    for service in (o for o in objects if o["kind"] == "Service"):
        behind = [
            c for c in _launched(objects)
            if selects(service["spec"]["selector"], c.owner["spec"]["template"]["metadata"]["labels"])
        ]  # fmt: skip
        owners = {c.owner["metadata"]["name"] for c in behind}
        assert len(owners) == 1, f"Service/{service['metadata']['name']} selects {owners}"
        for port in service["spec"]["ports"]:
            target = behind[0].port(port.get("targetPort", port["port"]))
            assert target is not None, f"Service/{service['metadata']['name']}: {port}"
            out[(service["metadata"]["name"], int(port["port"]))] = (behind[0].role(flags), target)
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_reach_a_broker_backend_and_ingresses_a_broker_frontend(
    renders: dict, overlay: str
) -> None:
    objects, flags = renders[overlay], launch_flags()
    backends = _service_backends(objects)
    brokers = {
        c.owner["metadata"]["name"]: c for c in _launched(objects) if c.role(flags) == "broker"
    }
    side = {"worker": "--backend", "ingress": "--frontend"}
    for container in _launched(objects):
        role = container.role(flags)
        if role not in side:
            continue
        endpoints = container.option(flags, "--broker")
        assert endpoints, f"{container.where}: no --broker"
        for endpoint in endpoints:
            host, port = endpoint_port(endpoint)
            assert (host, port) in backends, f"{container.where}: no Service {host}:{port}"
            behind_role, target = backends[(host, port)]
            assert behind_role == "broker"
            broker = brokers[host]  # each broker's Service is named as its Deployment
            (bound,) = broker.option(flags, side[role])
            assert endpoint_port(bound)[1] == target, f"{container.where}: {endpoint}"


def test_two_brokers_each_have_workers_and_every_ingress_uses_both(renders: dict) -> None:
    objects, flags = renders["two-brokers"], launch_flags()
    by_role: dict[str, list[Container]] = {}
    for container in _launched(objects):
        by_role.setdefault(container.role(flags), []).append(container)
    assert len(by_role["broker"]) == 2
    worker_brokers = {endpoint_port(w.option(flags, "--broker")[0])[0] for w in by_role["worker"]}
    assert worker_brokers == {"broker", "broker-b"}
    for ingress in by_role["ingress"]:
        hosts = {endpoint_port(e)[0] for e in ingress.option(flags, "--broker")}
        assert hosts == {"broker", "broker-b"}


def _config(container: Container, objects: list[dict[str, Any]]) -> dict[str, Any]:
    path = container.env("EMBEDMESH_CONFIG")
    assert path, f"{container.where}: no EMBEDMESH_CONFIG"
    volume, inside = container.volume_at(path) or ({}, "")
    assert "configMap" in volume, f"{container.where}: {path} is not on a ConfigMap"
    return tomllib.loads(projected_files(volume, objects)[inside])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_ingress_grace_period_covers_its_pre_stop_pause_and_drain(
    renders: dict, overlay: str
) -> None:
    objects, flags = renders[overlay], launch_flags()
    for container in _launched(objects):
        if container.role(flags) != "ingress":
            continue
        drain = container.option(flags, "--drain-grace")
        grace = float(drain[-1]) if drain else _config(container, objects)["ingress"]["drain_grace"]
        pre_stop = container.spec["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        period = container.pod["terminationGracePeriodSeconds"]
        assert period >= float(pre_stop[1]) + grace + 5, f"{container.where}: {period} s"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_config_file_holds_only_settings_each_role_accepts(
    renders: dict, overlay: str, tmp_path: Path
) -> None:
    config_file = launch_module("config_file")
    if config_file is None:
        pytest.skip("this mesh-launch reads no --config file")
    objects, flags = renders[overlay], launch_flags()
    for container in _launched(objects):
        volume, inside = container.volume_at(container.env("EMBEDMESH_CONFIG") or "") or ({}, "")
        path = tmp_path / "config.toml"
        path.write_text(projected_files(volume, objects)[inside])
        # An unknown section or key, or a value of the wrong type for this role, raises.
        config_file.load(path, container.role(flags))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_embedmesh_variable_set_is_a_setting_of_mesh_launch(
    renders: dict, overlay: str
) -> None:
    options = launch_module("options")
    if options is None:
        pytest.skip("this mesh-launch does not declare its settings in one place")
    from launch.cli import main

    known = {d.env for d in options.declared()} | {
        str(p.envvar) for p in main.params if isinstance(p, click.Option) and p.envvar
    }
    for container in _launched(renders[overlay]):
        for item in container.spec.get("env", []):
            if item["name"].startswith("EMBEDMESH_"):
                assert item["name"] in known, f"{container.where}: {item['name']}"


def test_every_pod_runs_as_a_non_root_user_on_a_read_only_root(renders: dict) -> None:
    for overlay in OVERLAYS:
        for container in containers(renders[overlay]):
            pod_ctx = container.pod.get("securityContext", {})
            assert pod_ctx.get("runAsNonRoot") is True and pod_ctx.get("runAsUser", 0) > 0
            ctx = container.spec.get("securityContext", {})
            assert ctx.get("readOnlyRootFilesystem") is True, container.where
            assert ctx.get("allowPrivilegeEscalation") is False, container.where


def test_gpu_workers_ask_for_one_gpu_each_and_use_it_as_device_0(renders: dict) -> None:
    flags = launch_flags()
    for overlay in ("gpu", "multi-model", "two-brokers"):
        workers = [c for c in _launched(renders[overlay]) if c.role(flags) == "worker"]
        assert workers
        for worker in workers:
            assert worker.spec["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert worker.option(flags, "--gpu") == ["0"], worker.where
    for worker in _launched(renders["cpu"]):
        assert "nvidia.com/gpu" not in worker.spec["resources"].get("limits", {})


def _app_routes() -> set[str]:
    from mesh.ingress.app import create_app
    from mesh.ingress.config import IngressConfig

    app = create_app(IngressConfig(brokers=["ipc://unused"]))
    return {r.canonical for r in app.router.resources()}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ingress_probes_ask_readiness_and_liveness_on_the_routes_that_answer_them(
    renders: dict, overlay: str
) -> None:
    """Readiness on the route that is 503 while a model has no worker; liveness on the one
    that stays 200 then (a restart brings no worker back)."""
    flags, routes = launch_flags(), _app_routes()
    for container in _launched(renders[overlay]):
        if container.role(flags) not in ("ingress", "all"):
            continue
        ready = container.spec["readinessProbe"]["httpGet"]["path"]
        live = container.spec["livenessProbe"]["httpGet"]["path"]
        assert (ready, live) == ("/health/ready", "/health/live"), container.where
        assert {ready, live} <= routes
