"""Where namespace hosts cannot be made, bench/netns.py says why (the tests skip with it)."""

from __future__ import annotations

import subprocess

import pytest

from bench import netns


def test_without_root_the_reason_is_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns.unavailable() == "network namespaces need root (ip netns add)"


def test_without_iproute2_the_reason_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda _: None)
    assert "iproute2" in (netns.unavailable() or "")


def test_a_refused_netns_add_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda _: "/usr/sbin/ip")

    def refused(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(["ip", *args], 1, "", "mount --make-shared failed")

    monkeypatch.setattr(netns, "_ip", refused)
    assert netns.unavailable() == "ip netns add failed: mount --make-shared failed"


def test_hosts_are_numbered_on_the_private_subnet() -> None:
    hosts = netns.Hosts(3)  # not created: names and addresses only
    assert [h.ip for h in hosts.hosts] == ["10.77.0.11", "10.77.0.12", "10.77.0.13"]
    assert all(h.name.startswith(hosts.tag + "-") for h in hosts.hosts)
    assert netns._NAME.match(hosts.switch)
