"""bench/topology.py: a topology file read into hosts, roles, links and load, every key checked
(a typo or a dangling name is an error naming it), and a sweep's overrides."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench import topology
from bench.topology import TopologyError

EXAMPLES = Path(topology.__file__).parent / "topologies"
BASE = """
[load]
concurrency = 4
[hosts.b]
broker = { flags = "--log-level INFO" }
[hosts.w]
workers = [{ broker = "b", engine = "null", count = 2, flags = "--device cpu --threads 1" }]
[hosts.f]
ingress = { brokers = ["b"], port = 8100 }
load_procs = 2
[[links]]
hosts = ["w", "b"]
delay_ms = 2
"""


def _parse(text: str) -> topology.Topology:
    return topology.parse(tomllib.loads(text), "t")


def test_a_file_gives_hosts_roles_links_and_load() -> None:
    topo = _parse(BASE)
    assert [h.name for h in topo.hosts] == ["b", "w", "f"] and topo.name == "t"
    assert all(h.kind == "netns" for h in topo.hosts) and topo.curve
    assert topo.host("b").broker == topology.Broker(("--log-level", "INFO"), 5555, 5556)
    (w,) = topo.host("w").workers
    assert (w.broker, w.engine, w.count, w.flags) == (
        "b",
        "null",
        2,
        ("--device", "cpu", "--threads", "1"),
    )
    assert topo.host("f").ingress == topology.Ingress(("b",), (), 8100)
    assert topo.worker_count == 2 and topo.workers_behind(topo.host("f").ingress) == 2
    assert topo.delay_ms("b", "w") == topo.delay_ms("w", "b") == 2.0
    assert topo.delay_ms("f", "b") == 0.0 and topo.delay_ms("w", "w") == 0.0
    assert (topo.load.mode, topo.load.concurrency, topo.load.texts_per_request) == ("closed", 4, 8)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("[load]", "[load]\nconcurency = 3"), "unknown key(s) concurency"),
        (('broker = "b", engine', 'broker = "x", engine'), "worker's broker 'x'"),
        (('engine = "null"', 'engine = "fast"'), "engine is real or null"),
        (('brokers = ["b"]', 'brokers = ["w"]'), "ingress brokers must name broker hosts"),
        (('hosts = ["w", "b"]', 'hosts = ["w", "z"]'), "two different hosts"),
        (("load_procs = 2", "load_procs = 0"), "needs a load host"),
        (("load_procs = 2", "load_procs = true"), "wrong type"),
        (("[hosts.f]", '[hosts.f]\nkind = "ssh"'), "needs ssh = 'user@host'"),
        (("[hosts.f]", '[hosts.f]\nkind = "vm"'), "kind must be one of"),
        (("[load]", '[load]\nmode = "open"'), "needs rate > 0"),
        (("[hosts.b]", '[hosts.b]\nkind = "external"'), "needs an address and runs no load"),
        (("[hosts.w]", '[hosts.w]\nkind = "ssh"\nssh = "me@w"'), "roles over ssh need curve_dir"),
        (("[hosts.f]", '[hosts.f]\nkind = "external"\naddress = "f.svc"'), "runs no load"),
    ],
)
def test_what_cannot_run_is_refused_with_its_name(change: tuple[str, str], says: str) -> None:
    old, new = change
    with pytest.raises(TopologyError, match=None) as err:
        _parse(BASE.replace(old, new, 1))
    assert says in str(err.value)


def test_an_ssh_host_is_reached_at_its_ssh_address_unless_told() -> None:
    text = BASE.replace("[hosts.f]", '[hosts.f]\nkind = "ssh"\nssh = "me@10.1.2.3"', 1)
    f = _parse('curve_dir = "/srv/keys"\n' + text).host("f")
    assert f.ssh == topology.Ssh("me@10.1.2.3") and f.address == ""
    table = '[hosts.f]\nkind = "ssh"\naddress = "10.9.9.9"\nssh = { target = "me@gw", python = "/v/bin/python", prefix = "cd /m &&", options = ["-p", "2222"] }'
    f = _parse("curve = false\n" + BASE.replace("[hosts.f]", table, 1)).host("f")
    assert f.ssh == topology.Ssh("me@gw", "/v/bin/python", "cd /m &&", ("-p", "2222"))
    assert f.address == "10.9.9.9"


def test_a_sweeps_overrides_set_every_worker_and_link() -> None:
    topo = _parse(BASE).with_overrides(engine="real", delay_ms=20)
    assert {w.engine for h in topo.hosts for w in h.workers} == {"real"}
    assert topo.delay_ms("w", "b") == 20.0
    assert _parse(BASE).with_overrides() == _parse(BASE)


def test_every_example_topology_loads() -> None:
    names = {topology.load(p).name for p in EXAMPLES.glob("*.toml")}
    assert {"workers-1", "workers-2", "workers-4", "brokers-1", "brokers-2", "hop-one-host",
            "hop-split", "ssh-gpu-fleet"} <= names  # fmt: skip
    assert [h.name for h in topology.load(EXAMPLES / "workers-4.toml").hosts if h.workers] == [
        "w1",
        "w2",
        "w3",
        "w4",
    ]
