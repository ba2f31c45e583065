"""A mesh laid out on hosts, read from a TOML file: what ``mesh-bench cluster`` starts and loads.

    name = "two worker hosts"
    curve = true                      # CURVE on every link (false: --insecure)

    [load]                            # one load, split over every load process
    mode = "closed"                   # closed: `concurrency` clients; open: `rate` requests/s
    concurrency = 16
    texts_per_request = 8
    duration_s = 20
    warmup_s = 5

    [hosts.b1]                        # kind: netns (made here), ssh (user@host), local,
                                      # external (already running: nothing started there)
    broker = {}                       # flags, front_port, back_port
    [hosts.w1]
    workers = [{ broker = "b1", engine = "null", flags = "--device cpu --threads 1" }]
    [hosts.front]
    ingress = { brokers = ["b1"], flags = "--ingress-procs 1" }
    load_procs = 2                    # load processes on this host

    [[links]]                         # added delay each way between two hosts
    hosts = ["w1", "b1"]
    delay_ms = 2

Every key is checked: a typo is an error naming it, not a silently different run. The
reference of every key: bench/README.md ("cluster").
"""

from __future__ import annotations

import dataclasses
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("netns", "ssh", "local", "external")
ENGINES = ("real", "null")
MODES = ("closed", "open")
DEFAULT_MODEL = "all-MiniLM-L6-v2"


class TopologyError(ValueError):
    """A topology file that cannot be run as written."""


@dataclass(frozen=True)
class Ssh:
    """How a host is reached over ssh: ``target`` (user@host), the remote ``python`` (with
    embedmesh installed), a shell ``prefix`` run before each command (``cd /srv/mesh &&``),
    more ``options`` for ssh (``-i KEY``, ``-p PORT``)."""

    target: str
    python: str = "python3"
    prefix: str = ""
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Broker:
    flags: tuple[str, ...] = ()
    front_port: int = 5555
    back_port: int = 5556


@dataclass(frozen=True)
class Worker:
    """``count`` worker processes of ``broker`` (a host name), each ``mesh-launch --role
    worker FLAGS`` (``engine = "null"``: ``python -m bench.null_worker FLAGS``)."""

    broker: str
    flags: tuple[str, ...] = ()
    engine: str = "real"
    count: int = 1


@dataclass(frozen=True)
class Ingress:
    brokers: tuple[str, ...]
    flags: tuple[str, ...] = ()
    port: int = 8000


@dataclass(frozen=True)
class Host:
    name: str
    kind: str = "netns"
    # What the other hosts reach it at; ssh: default the ssh target's host part; external: needed
    address: str = ""
    ssh: Ssh | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    broker: Broker | None = None
    workers: tuple[Worker, ...] = ()
    ingress: Ingress | None = None
    load_procs: int = 0


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    delay_ms: float


@dataclass(frozen=True)
class Load:
    mode: str = "closed"
    concurrency: int = 16
    rate: float = 0.0
    texts_per_request: int = 8
    duration_s: float = 20.0
    warmup_s: float = 5.0
    model: str = DEFAULT_MODEL
    priority: str = ""  # "" lets the ingress pick the lane by size
    timeout_s: float = 120.0
    corpus: str = ""  # "" is the checkout's data/corpus.jsonl
    api_key_file: str = ""  # an ingress started with --api-key(-file): the key, read here


@dataclass(frozen=True)
class Topology:
    name: str
    hosts: tuple[Host, ...]
    load: Load = field(default_factory=Load)
    links: tuple[Link, ...] = ()
    curve: bool = True
    curve_dir: str = ""  # ssh hosts: where the keys are on every host; else made per run
    heartbeat_interval_s: float | None = None
    heartbeat_liveness: int | None = None

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def delay_ms(self, a: str, b: str) -> float:
        """The delay added each way between hosts ``a`` and ``b`` (0 on one host)."""
        if a == b:
            return 0.0
        return next((k.delay_ms for k in self.links if {k.a, k.b} == {a, b}), 0.0)

    @property
    def worker_count(self) -> int:
        return sum(w.count for h in self.hosts for w in h.workers)

    def workers_behind(self, ingress: Ingress) -> int:
        """Workers an ingress reaches through its brokers: what it must list before a run."""
        return sum(w.count for h in self.hosts for w in h.workers if w.broker in ingress.brokers)

    def with_overrides(self, engine: str | None = None, delay_ms: float | None = None) -> Topology:
        """Every worker on ``engine``; every declared link at ``delay_ms``: a sweep's row."""
        topo = self
        if engine is not None:
            hosts = tuple(
                dataclasses.replace(
                    h, workers=tuple(dataclasses.replace(w, engine=engine) for w in h.workers)
                )
                for h in topo.hosts
            )
            topo = dataclasses.replace(topo, hosts=hosts)
        if delay_ms is not None:
            links = tuple(dataclasses.replace(k, delay_ms=delay_ms) for k in topo.links)
            topo = dataclasses.replace(topo, links=links)
        return _checked(topo)


def load(path: str | Path) -> Topology:
    """The topology in TOML file ``path``; TopologyError saying what is wrong."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TopologyError(f"{path}: {exc}") from exc
    return parse(doc, default_name=path.stem)


def parse(doc: Mapping[str, Any], default_name: str = "topology") -> Topology:
    """A topology from a parsed TOML document."""
    top = _Table(doc, "the file")
    hosts = tuple(_host(name, raw) for name, raw in top.table("hosts").items())
    topo = Topology(
        name=top.get("name", str, default_name),
        hosts=hosts,
        load=_load(_Table(top.table("load"), "[load]")),
        links=tuple(_link(i, raw) for i, raw in enumerate(top.get("links", list, []))),
        curve=top.get("curve", bool, True),
        curve_dir=top.get("curve_dir", str, ""),
        heartbeat_interval_s=top.get("heartbeat_interval_s", (int, float), None),
        heartbeat_liveness=top.get("heartbeat_liveness", int, None),
    )
    top.done()
    return _checked(topo)


class _Table:
    """A TOML table read key by key; ``done`` refuses the keys nobody asked for."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, Mapping):
            raise TopologyError(f"{where} must be a table")
        self.raw, self.where, self.seen = raw, where, set[str]()

    def get(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.seen.add(key)
        if key not in self.raw:
            return default
        value = self.raw[key]
        # bool is an int in Python: a count of `true` is refused as a mistake.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise TopologyError(f"{self.where}: {key} = {value!r} has the wrong type")
        return value

    def table(self, key: str) -> Mapping[str, Any]:
        return self.get(key, dict, {})

    def flags(self) -> tuple[str, ...]:
        return tuple(shlex.split(self.get("flags", str, "")))

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.seen)
        if unknown:
            raise TopologyError(f"{self.where}: unknown key(s) {', '.join(unknown)}")


def _host(name: str, raw: Any) -> Host:
    t = _Table(raw, f"[hosts.{name}]")
    kind = t.get("kind", str, "netns")
    if kind not in KINDS:
        raise TopologyError(f"[hosts.{name}]: kind must be one of {', '.join(KINDS)}")
    ssh = None
    if "ssh" in raw:
        s = _Table({"target": raw["ssh"]} if isinstance(raw["ssh"], str) else raw["ssh"],
                   f"[hosts.{name}].ssh")  # fmt: skip
        ssh = Ssh(s.get("target", str, ""), s.get("python", str, "python3"),
                  s.get("prefix", str, ""), tuple(s.get("options", list, [])))  # fmt: skip
        s.done()
    t.seen.add("ssh")
    broker = None
    if "broker" in raw:
        b = _Table(raw["broker"], f"[hosts.{name}].broker")
        broker = Broker(b.flags(), b.get("front_port", int, 5555), b.get("back_port", int, 5556))
        b.done()
    t.seen.add("broker")
    workers = tuple(_worker(name, i, w) for i, w in enumerate(t.get("workers", list, [])))
    ingress = None
    if "ingress" in raw:
        g = _Table(raw["ingress"], f"[hosts.{name}].ingress")
        ingress = Ingress(tuple(g.get("brokers", list, [])), g.flags(), g.get("port", int, 8000))
        g.done()
    t.seen.add("ingress")
    host = Host(
        name, kind, t.get("address", str, ""), ssh, dict(t.table("env")), broker, workers,
        ingress, t.get("load_procs", int, 0),
    )  # fmt: skip
    t.done()
    return host


def _worker(host: str, index: int, raw: Any) -> Worker:
    t = _Table(raw, f"[hosts.{host}].workers[{index}]")
    worker = Worker(
        t.get("broker", str, ""), t.flags(), t.get("engine", str, "real"), t.get("count", int, 1)
    )
    t.done()
    return worker


def _link(index: int, raw: Any) -> Link:
    t = _Table(raw, f"[[links]] {index}")
    pair = t.get("hosts", list, [])
    if len(pair) != 2 or not all(isinstance(h, str) for h in pair):
        raise TopologyError(f"[[links]] {index}: hosts must name two hosts")
    link = Link(pair[0], pair[1], float(t.get("delay_ms", (int, float), 0.0)))
    t.done()
    return link


def _load(t: _Table) -> Load:
    d = Load()
    load = Load(
        mode=t.get("mode", str, d.mode),
        concurrency=t.get("concurrency", int, d.concurrency),
        rate=float(t.get("rate", (int, float), d.rate)),
        texts_per_request=t.get("texts_per_request", int, d.texts_per_request),
        duration_s=float(t.get("duration_s", (int, float), d.duration_s)),
        warmup_s=float(t.get("warmup_s", (int, float), d.warmup_s)),
        model=t.get("model", str, d.model),
        priority=t.get("priority", str, d.priority),
        timeout_s=float(t.get("timeout_s", (int, float), d.timeout_s)),
        corpus=t.get("corpus", str, d.corpus),
        api_key_file=t.get("api_key_file", str, d.api_key_file),
    )
    t.done()
    return load


def _checked(topo: Topology) -> Topology:
    """``topo`` if it can run; TopologyError naming the first thing that cannot."""
    names = {h.name for h in topo.hosts}
    brokers = {h.name for h in topo.hosts if h.broker is not None}
    for h in topo.hosts:
        if h.kind == "ssh" and (h.ssh is None or not h.ssh.target):
            raise TopologyError(f"[hosts.{h.name}]: kind = 'ssh' needs ssh = 'user@host'")
        if h.kind != "ssh" and h.ssh is not None:
            raise TopologyError(f"[hosts.{h.name}]: ssh is for kind = 'ssh' hosts")
        if h.kind == "external" and (not h.address or h.load_procs):
            raise TopologyError(f"[hosts.{h.name}]: an external host (roles started by others) "
                                "needs an address and runs no load")  # fmt: skip
        if h.load_procs < 0:
            raise TopologyError(f"[hosts.{h.name}]: load_procs must be 0 or more")
        for w in h.workers:
            if w.broker not in brokers:
                raise TopologyError(f"[hosts.{h.name}]: worker's broker {w.broker!r} is no "
                                    "host with a broker")  # fmt: skip
            if w.engine not in ENGINES or w.count < 1:
                raise TopologyError(f"[hosts.{h.name}]: a worker's engine is real or null, "
                                    "its count 1 or more")  # fmt: skip
        if h.ingress is not None and not (h.ingress.brokers and set(h.ingress.brokers) <= brokers):
            raise TopologyError(f"[hosts.{h.name}]: ingress brokers must name broker hosts")
    for k in topo.links:
        if not {k.a, k.b} <= names or k.a == k.b or k.delay_ms < 0:
            raise TopologyError(f"[[links]] {k.a}-{k.b}: two different hosts, delay_ms >= 0")
    remote_roles = any(h.kind == "ssh" and (h.broker or h.workers or h.ingress) for h in topo.hosts)
    if remote_roles and topo.curve and not topo.curve_dir:
        raise TopologyError("roles over ssh need curve_dir (the keys, copied to every host) "
                            "or curve = false")  # fmt: skip
    if not brokers or not any(h.ingress for h in topo.hosts) or not topo.worker_count:
        raise TopologyError("a topology needs a broker, a worker and an ingress")
    if not any(h.load_procs for h in topo.hosts):
        raise TopologyError("a topology needs a load host (load_procs = 1 or more)")
    _check_load(topo.load)
    return topo


def _check_load(load: Load) -> None:
    if load.mode not in MODES:
        raise TopologyError(f"[load]: mode must be one of {', '.join(MODES)}")
    if load.mode == "closed" and load.concurrency < 1:
        raise TopologyError("[load]: a closed load needs concurrency >= 1")
    if load.mode == "open" and load.rate <= 0:
        raise TopologyError("[load]: an open load needs rate > 0")
    if load.texts_per_request < 1 or load.duration_s <= 0 or load.warmup_s < 0:
        raise TopologyError("[load]: texts_per_request >= 1, duration_s > 0, warmup_s >= 0")
    if load.priority not in ("", "interactive", "batch"):
        raise TopologyError("[load]: priority is interactive, batch or '' (by size)")
