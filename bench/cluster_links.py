"""Delay between two hosts of a topology (``[[links]] delay_ms``), each way.

Two ways, the first that works: **netem** (``tc qdisc ... netem delay``) on each namespace
host's interface, filtered by the peer's address, so every packet between the two hosts
waits, whoever sends it; or a **fault proxy** (bench/faultproxy.py, ``delay`` mode) on the
dialling host in front of each port it connects to, in the coordinator's process. netem
needs the kernel's sch_netem module (missing on some machines: then the proxy); the proxy
works everywhere, and delays the mesh's own links only (a role's connection, the load's).
Hosts reached over ssh get no delay from here: set it there with ``tc qdisc ... netem``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

from bench.cluster_hosts import Place
from bench.faultproxy import FaultProxy
from bench.topology import Topology

DEV = "eth0"  # a namespace host's cable (bench/netns.py)


def netem_commands(delays: Mapping[str, float], dev: str = DEV) -> list[list[str]]:
    """``tc`` commands delaying what ``dev`` sends to each address by its milliseconds: a
    prio qdisc with one extra band per distinct delay (the default priomap uses only the
    first three, so only filtered traffic reaches the others), netem on each, and a u32
    filter per address."""
    values = sorted(set(delays.values()))
    cmds = [["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "prio",
             "bands", str(3 + len(values))]]  # fmt: skip
    for j, ms in enumerate(values):
        band = 4 + j
        cmds.append(["tc", "qdisc", "add", "dev", dev, "parent", f"1:{band}",
                     "handle", f"{40 + j}:", "netem", "delay", f"{ms:g}ms"])  # fmt: skip
        for ip, d in sorted(delays.items()):
            if d == ms:
                cmds.append(["tc", "filter", "add", "dev", dev, "protocol", "ip", "parent",
                             "1:0", "prio", "1", "u32", "match", "ip", "dst", f"{ip}/32",
                             "flowid", f"1:{band}"])  # fmt: skip
    return cmds


def _netem(namespace: str, delays: Mapping[str, float]) -> bool:
    """Apply ``netem_commands`` inside ``namespace``; False (and nothing left) if any fails."""
    for cmd in netem_commands(delays):
        done = subprocess.run(["ip", "netns", "exec", namespace, *cmd],
                              capture_output=True, timeout=30, check=False)  # fmt: skip
        if done.returncode != 0:
            subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", DEV,
                            "root"], capture_output=True, timeout=30, check=False)  # fmt: skip
            return False
    return True


class Links:
    """The endpoint a role on one host dials to reach a port on another, delayed as the
    topology says; ``way`` says how: "none", "netem" or "proxy"."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.proxies: dict[tuple[str, str, int], FaultProxy] = {}
        self.way = "none"

    def setup(self, places: Mapping[str, Place]) -> None:
        """netem on every delayed namespace host if that works; else the proxies, as dialled."""
        delayed = [k for k in self.topo.links if k.delay_ms > 0]
        if not delayed:
            return
        self.way = "proxy"
        hosts = {name for k in delayed for name in (k.a, k.b)}
        if any(places[name].netns_host is None for name in hosts):
            return
        for name in sorted(hosts):
            delays = {places[peer].address: self.topo.delay_ms(name, peer)
                      for peer in hosts if peer != name and self.topo.delay_ms(name, peer) > 0}  # fmt: skip
            netns_host = places[name].netns_host
            assert netns_host is not None
            if delays and not _netem(netns_host.name, delays):
                return  # its namespace goes with the run; the others' qdiscs too
        self.way = "netem"

    def address(self, src: Place, dst: Place, port: int) -> str:
        """``host:port`` that a process on ``src`` connects to for ``dst``'s ``port``."""
        delay = self.topo.delay_ms(src.name, dst.name)
        if delay <= 0 or self.way == "netem":
            return f"{dst.address}:{port}"
        if src.spec.kind == "ssh":
            raise RuntimeError(f"delay from an ssh host ({src.name}): set it there with tc netem")
        key = (src.name, dst.name, port)
        if key not in self.proxies:
            proxy = FaultProxy((dst.address, port))
            proxy.set_mode("delay", delay)
            # Started from a thread on src's network: the proxy's own thread inherits it.
            src.reach(proxy.run_in_thread)
            self.proxies[key] = proxy
        return f"127.0.0.1:{self.proxies[key].port}"

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop_thread()
        self.proxies.clear()
