"""Reading the rendered manifests of deploy/k8s: the containers that run ``mesh-launch``, their
flags, mounts and ports, and what ``mesh-launch`` declares (the truth the manifests are held
to)."""

from __future__ import annotations

import base64
import importlib
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import click

ROLES = ("broker", "worker", "ingress", "all")
POD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


@dataclass(frozen=True)
class Flag:
    """One option of ``mesh-launch``: the roles it applies to, whether it takes a value."""

    roles: frozenset[str]
    takes_value: bool


def launch_module(name: str) -> ModuleType | None:
    """``launch.NAME`` when the package that holds ``launch.cli`` has it; None where that
    package predates it (an editable install may still find another checkout's copy)."""
    import launch.cli

    try:
        module = importlib.import_module(f"launch.{name}")
    except ImportError:
        return None
    same = Path(module.__file__ or "").parent == Path(launch.cli.__file__ or "").parent
    return module if same else None


def _declared_flags() -> dict[str, Flag] | None:
    """From ``launch.options`` (every option declared once, with its roles); None where the
    package predates that module."""
    options = launch_module("options")
    if options is None:
        return None
    declared = options.declared
    return {
        d.flag: Flag(frozenset(r for r in ROLES if d.spec.applies_to(r)), d.spec.type is not None)
        for d in declared()
        if d.spec.flag
    }


def _help_roles(help_text: str) -> frozenset[str]:
    """The roles named in an option's help, as ``[worker, all]``; none named: every role."""
    named = {
        word
        for bracket in re.findall(r"\[([^\]]+)\]", help_text)
        for word in re.split(r"[\s,;]+", bracket)
        if word in ROLES
    }
    return frozenset(named or ROLES)


def launch_flags() -> dict[str, Flag]:
    """Every flag ``mesh-launch`` accepts, by name (``--http-port``)."""
    from launch.cli import main

    declared = _declared_flags()
    flags: dict[str, Flag] = {}
    for param in main.params:
        if not isinstance(param, click.Option):
            continue
        takes_value = not param.is_flag
        for name in param.opts:
            if declared is not None:
                flags[name] = declared.get(name, Flag(frozenset(ROLES), takes_value))
            else:
                flags[name] = Flag(_help_roles(param.help or ""), takes_value)
    return flags


@dataclass
class Container:
    """A container of a rendered pod template, with the object that holds it."""

    owner: dict[str, Any]
    spec: dict[str, Any]
    pod: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.owner['kind']}/{self.owner['metadata']['name']}/{self.spec['name']}"

    @property
    def runs_mesh_launch(self) -> bool:
        """The image's entrypoint runs (no ``command`` given), and it is ``mesh-launch``."""
        return "command" not in self.spec

    def options(self, flags: dict[str, Flag]) -> list[tuple[str, str | None]]:
        """``(--flag, value)`` for each option of its args (``--flag=value`` or ``--flag value``)."""
        args = [str(a) for a in self.spec.get("args", [])]
        found: list[tuple[str, str | None]] = []
        i = 0
        while i < len(args):
            arg = args[i]
            assert arg.startswith("--"), f"{self.where}: {shlex.join(args)}: stray {arg!r}"
            name, eq, value = arg.partition("=")
            known = flags.get(name)
            if not eq and known is not None and known.takes_value and i + 1 < len(args):
                value, eq = args[i + 1], "="
                i += 1
            found.append((name, value if eq else None))
            i += 1
        return found

    def option(self, flags: dict[str, Flag], name: str) -> list[str]:
        return [v for n, v in self.options(flags) if n == name and v is not None]

    def role(self, flags: dict[str, Flag]) -> str:
        roles = self.option(flags, "--role")
        return roles[-1] if roles else "all"

    def env(self, name: str) -> str | None:
        for item in self.spec.get("env", []):
            if item["name"] == name:
                return item.get("value")
        return None

    def volume_at(self, path: str) -> tuple[dict[str, Any], str] | None:
        """The pod volume mounted over ``path`` and the part of ``path`` inside it."""
        best: tuple[dict[str, Any], str] | None = None
        for mount in self.spec.get("volumeMounts", []):
            root = mount["mountPath"].rstrip("/")
            inside = path == root or path.startswith(root + "/")
            if inside and (best is None or len(root) > len(best[1])):
                best = (self.volume(mount["name"]), root)
        if best is None:
            return None
        return best[0], path[len(best[1]) :].lstrip("/")

    def volume(self, name: str) -> dict[str, Any]:
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        assert name in volumes, f"{self.where}: mounts volume {name!r}, which the pod lacks"
        return volumes[name]

    def port(self, ref: int | str) -> int | None:
        """The container port a probe or Service names (by name or number), or None."""
        for port in self.spec.get("ports", []):
            if ref in (port.get("name"), port["containerPort"]):
                return int(port["containerPort"])
        return None


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj.get("kind") in POD_KINDS:
        return obj["spec"]["template"]["spec"]
    return None


def containers(objects: list[dict[str, Any]], init: bool = True) -> Iterator[Container]:
    for obj in objects:
        pod = pod_spec(obj)
        if pod is None:
            continue
        lists = ("initContainers", "containers") if init else ("containers",)
        for key in lists:
            for spec in pod.get(key, []):
                yield Container(obj, spec, pod)


def projected_files(volume: dict[str, Any], objects: list[dict[str, Any]]) -> dict[str, str]:
    """File name -> content of a Secret or ConfigMap volume (its ``items``, else every key)."""
    if "secret" in volume:
        kind, name, source = "Secret", volume["secret"]["secretName"], volume["secret"]
    elif "configMap" in volume:
        kind, name, source = "ConfigMap", volume["configMap"]["name"], volume["configMap"]
    else:
        return {}
    obj = find(objects, kind, name)
    data = dict(obj.get("data", {}))
    if kind == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
    if "items" not in source:
        return data
    return {item["path"]: data[item["key"]] for item in source["items"]}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} in the render"
    return matches[0]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def endpoint_port(endpoint: str) -> tuple[str, int]:
    """``tcp://host:port`` -> (host, port)."""
    match = re.fullmatch(r"tcp://([^:/]+):(\d+)", endpoint)
    assert match, f"{endpoint!r} is not tcp://host:port"
    return match[1], int(match[2])


DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
