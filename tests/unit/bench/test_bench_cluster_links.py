"""bench/cluster_links.py: the tc commands that delay what a namespace host sends to each peer
(one netem band per distinct delay, a filter per peer), and the dialled endpoint of a link
without delay, delayed by netem, or through a delaying proxy."""

from __future__ import annotations

import socket
import threading

import pytest

from bench.cluster_hosts import Place
from bench.cluster_links import Links, netem_commands
from bench.topology import Host, parse


def test_each_distinct_delay_gets_a_band_and_each_peer_a_filter() -> None:
    cmds = [" ".join(c) for c in netem_commands({"10.0.0.2": 20, "10.0.0.3": 2, "10.0.0.4": 20})]
    assert cmds == [
        "tc qdisc add dev eth0 root handle 1: prio bands 5",
        "tc qdisc add dev eth0 parent 1:4 handle 40: netem delay 2ms",
        "tc filter add dev eth0 protocol ip parent 1:0 prio 1 u32 match ip dst 10.0.0.3/32 flowid 1:4",
        "tc qdisc add dev eth0 parent 1:5 handle 41: netem delay 20ms",
        "tc filter add dev eth0 protocol ip parent 1:0 prio 1 u32 match ip dst 10.0.0.2/32 flowid 1:5",
        "tc filter add dev eth0 protocol ip parent 1:0 prio 1 u32 match ip dst 10.0.0.4/32 flowid 1:5",
    ]


TOPO = parse({
    "hosts": {
        "a": {"kind": "local", "broker": {}, "load_procs": 1,
              "ingress": {"brokers": ["a"]}, "workers": [{"broker": "a"}]},
        "b": {"kind": "local", "address": "127.0.0.1"},
    },
    "links": [{"hosts": ["a", "b"], "delay_ms": 30}],
})  # fmt: skip


def _places() -> dict[str, Place]:
    return {h.name: Place(h, "127.0.0.1") for h in TOPO.hosts}


def test_hosts_without_delay_dial_the_address_itself() -> None:
    places = _places()
    links = Links(TOPO.with_overrides(delay_ms=0))
    links.setup(places)
    assert links.way == "none"
    assert links.address(places["a"], places["b"], 5556) == "127.0.0.1:5556"


def test_hosts_other_than_namespaces_are_delayed_by_a_proxy_on_the_dialling_host() -> None:
    places = _places()
    links = Links(TOPO)
    links.setup(places)
    assert links.way == "proxy"  # netem is for namespace hosts only
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept()[0].sendall(b"hello"), daemon=True).start()
    try:
        dial = links.address(places["a"], places["b"], port)
        assert dial != f"127.0.0.1:{port}" and dial == links.address(places["a"], places["b"], port)
        host, p = dial.rsplit(":", 1)
        with socket.create_connection((host, int(p)), timeout=5) as conn:
            assert conn.recv(16) == b"hello"  # through the proxy, to the real port
        assert links.address(places["a"], places["a"], port) == f"127.0.0.1:{port}"
    finally:
        links.close()
        server.close()


def test_an_ssh_host_is_not_delayed_from_here() -> None:
    ssh_host = Host("b", kind="ssh")  # host b of the topology, reached over ssh
    links = Links(TOPO.with_overrides(delay_ms=5))
    links.way = "proxy"
    with pytest.raises(RuntimeError, match="set it there with tc netem"):
        links.address(Place(ssh_host, "10.0.0.9"), _places()["a"], 1)
