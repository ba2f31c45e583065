"""One run of a topology: its roles started host by host, the load from every load host,
``/metrics`` watched, everything stopped however the run ends; the result as a dict.

Order: brokers (each listening before the next role starts), workers, ingresses (each ready
once ``/health`` answers 200 and ``/v1/models`` counts every worker behind its brokers),
then the load processes, which start one agreed instant (bench/cluster_load.py). Links
with an added delay: bench/cluster_links.py.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench import cluster_metrics
from bench.cluster_hosts import Place, Places, stop_all
from bench.cluster_links import Links
from bench.cluster_load import LoadProcess, coordinate, instructions
from bench.corpus import DEFAULT_CORPUS, load_texts, request_bodies
from bench.load import Target
from bench.procs import Job, Timing, closed_jobs, open_jobs
from bench.stats import cdf_ms, summarize, timeline
from bench.topology import Topology

START_TIMEOUT_S = 240.0  # a real CPU worker per host on a busy 2-core machine loads slowly


def _http_get(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=timeout_s) as resp:  # fmt: skip
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


class ClusterRun:
    """A topology's roles and load; ``run()`` gives the result and always tears down."""

    def __init__(self, topo: Topology, logs: Path | None = None, label: str = "") -> None:
        self.topo = topo
        self.label = label or topo.name
        self.logs = logs or Path(tempfile.mkdtemp(prefix="embedmesh-cluster-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.places = Places(topo.hosts)
        self.links = Links(topo)
        self.commands: list[dict[str, str]] = []
        key_file = topo.load.api_key_file
        self.api_key = Path(key_file).read_text().strip() if key_file else None

    def run(self) -> dict[str, Any]:
        try:
            self.places.open()
            self.links.setup(self.places.places)
            security = self._security()
            self._start_brokers(security)
            self._start_workers(security)
            urls = self._start_ingresses(security)
            return self._load(urls)
        finally:
            self.close()

    def close(self) -> None:
        try:
            self.places.close()
        finally:
            self.links.close()

    # ---- roles ----------------------------------------------------------------------------

    def _common(self) -> list[str]:
        t = self.topo
        out = []
        if t.heartbeat_interval_s is not None:
            out += ["--heartbeat-interval", str(t.heartbeat_interval_s)]
        if t.heartbeat_liveness is not None:
            out += ["--heartbeat-liveness", str(t.heartbeat_liveness)]
        return out

    def _security(self) -> list[str]:
        starts = any(h.broker or h.workers or h.ingress for h in self.topo.hosts
                     if h.kind != "external")  # fmt: skip
        if not self.topo.curve or not starts:
            return ["--insecure"]
        if self.topo.curve_dir:
            return ["--curve-dir", self.topo.curve_dir]
        keys = self.logs / "keys"
        subprocess.run([sys.executable, "-m", "launch.cli", "--gen-keys", str(keys)],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        return ["--curve-dir", str(keys)]

    def _start(self, place: Place, what: str, module: str, args: list[str]) -> None:
        log = self.logs / f"{place.name}-{what}-{len(place.started)}.log"
        started = place.start(what, module, args, log)
        self.commands.append({"host": place.name, "role": what, "log": str(log),
                              "command": " ".join(started.proc.args)})  # fmt: skip

    def _start_brokers(self, security: list[str]) -> None:
        for spec in self.topo.hosts:
            if spec.broker is None:
                continue
            place, b = self.places[spec.name], spec.broker
            args = ["--role", "broker", "--frontend", f"tcp://{place.address}:{b.front_port}",
                    "--backend", f"tcp://{place.address}:{b.back_port}",
                    *security, *self._common(), *b.flags]  # fmt: skip
            if spec.kind != "external":
                self._start(place, "broker", "launch.cli", args)
            self._wait(
                place, "broker", lambda p=place, b=b: _listening(f"{p.address}:{b.front_port}")
            )

    def _start_workers(self, security: list[str]) -> None:
        for spec in self.topo.hosts:
            place = self.places[spec.name]
            if spec.kind == "external":
                continue  # counted, not started: the ingress waits for them all the same
            for w in spec.workers:
                broker = self.places[w.broker]
                assert broker.spec.broker is not None
                dial = self.links.address(place, broker, broker.spec.broker.back_port)
                link = ["--broker", f"tcp://{dial}", *security, *self._common(), *w.flags]
                module, role = ("bench.null_worker", []) if w.engine == "null" else (
                    "launch.cli", ["--role", "worker"])  # fmt: skip
                for _ in range(w.count):
                    self._start(place, f"worker-{w.engine}", module, [*role, *link])

    def _start_ingresses(self, security: list[str]) -> dict[str, str]:
        """Every ingress started and ready; its place name -> the /v1 URL it serves at."""
        urls: dict[str, str] = {}
        for spec in self.topo.hosts:
            if spec.ingress is None:
                continue
            place, g = self.places[spec.name], spec.ingress
            urls[spec.name] = f"http://{place.address}:{g.port}"
            if spec.kind == "external":
                continue  # served already: only waited for
            links = []
            for name in g.brokers:
                broker = self.places[name]
                assert broker.spec.broker is not None
                dial = self.links.address(place, broker, broker.spec.broker.front_port)
                links += ["--broker", f"tcp://{dial}"]
            args = ["--role", "ingress", *links, "--http-host", place.address,
                    "--http-port", str(g.port), "--auto-truncate",
                    *security, *self._common(), *g.flags]  # fmt: skip
            self._start(place, "ingress", "launch.cli", args)
        for name, url in urls.items():
            place = self.places[name]
            ingress = place.spec.ingress
            assert ingress is not None
            want = self.topo.workers_behind(ingress)
            self._wait(place, f"ingress with {want} workers", lambda p=place, u=url, n=want: (
                self._serving(p, u, n)))  # fmt: skip
        return urls

    def _serving(self, place: Place, url: str, workers: int) -> bool:
        status, _ = place.reach(lambda: _http_get(f"{url}/health"))
        if status != 200:
            return False
        status, body = place.reach(lambda: _http_get(f"{url}/v1/models", self.api_key))
        if status != 200:
            return False
        served = {m.get("id"): int(m.get("workers", 0)) for m in json.loads(body)["data"]}
        return served.get(self.topo.load.model, 0) >= workers

    def _wait(self, place: Place, what: str, ready: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not place.reach(ready):
            # Any role that ended: a worker that failed on another host never comes up.
            dead = [s for p in self.places.places.values() for s in p.started
                    if s.proc.poll() is not None]  # fmt: skip
            if dead or time.monotonic() > deadline:
                why = f"{dead[0].what} exited with {dead[0].proc.returncode}" if dead else "timeout"
                raise RuntimeError(f"{place.name}: {what} not up ({why}); logs in {self.logs}\n"
                                   + self._log_tails())  # fmt: skip
            time.sleep(0.5)

    def _log_tails(self, chars: int = 1500) -> str:
        parts = []
        for c in self.commands:
            text = (
                Path(c["log"]).read_text(errors="replace")[-chars:]
                if Path(c["log"]).exists()
                else ""
            )
            parts.append(f"--- {c['host']} {c['role']}\n{text}")
        return "\n".join(parts)

    # ---- load -----------------------------------------------------------------------------

    def _jobs(self) -> list[Job]:
        load = self.topo.load
        texts = load_texts(load.corpus or DEFAULT_CORPUS)
        bodies = request_bodies(texts, load.model, load.texts_per_request, "float",
                                load.priority or None)  # fmt: skip
        procs = sum(h.load_procs for h in self.topo.hosts)
        if load.mode == "closed":
            return closed_jobs("", bodies, load.concurrency, procs)
        return open_jobs("", bodies, load.rate, procs, seed=0)

    def _load(self, urls: dict[str, str]) -> dict[str, Any]:
        load = self.topo.load
        timing = Timing(load.duration_s, load.warmup_s)
        jobs = iter(self._jobs())
        ingresses = list(urls)
        procs: list[LoadProcess] = []
        for spec in self.topo.hosts:
            place = self.places[spec.name]
            for _ in range(spec.load_procs):
                job = next(jobs, None)
                if job is None:
                    break  # fewer clients than processes: the rest stay idle
                front = self.places[ingresses[len(procs) % len(ingresses)]]
                assert front.spec.ingress is not None
                dial = self.links.address(place, front, front.spec.ingress.port)
                log = self.logs / f"{place.name}-load-{len(procs)}.log"
                started = place.start("load", "bench.cluster_load", [], log, stdin_commands=True)
                lp = LoadProcess(f"{place.name}/{len(procs)}", started.proc.stdin,
                                 started.proc.stdout, lambda s=started: s.proc.poll() is None,
                                 [job])  # fmt: skip
                lp.send(instructions(Target(f"http://{dial}/v1", self.api_key, load.timeout_s),
                                     job.bodies, [job], timing))  # fmt: skip
                procs.append(lp)
        watches = {name: self._watch(name, url) for name, url in urls.items()}
        lanes = coordinate(
            procs, timing,
            on_window=lambda: [w.start() for w in watches.values()],
            on_done=lambda: [w.stop() for w in watches.values()],
        )  # fmt: skip
        stop_all([s for p in self.places.places.values() for s in p.started if s.what == "load"])
        return self._result(lanes, {n: w.figures() for n, w in watches.items()})

    def _watch(self, name: str, url: str) -> cluster_metrics.Watch:
        place = self.places[name]

        def read() -> str | None:
            status, body = place.reach(lambda: _http_get(f"{url}/metrics"))
            return body.decode(errors="replace") if status == 200 else None

        return cluster_metrics.Watch(read)

    def _result(self, lanes: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.label, "topology": self.topo.name, "lanes": {}}
        for lane, m in lanes.items():
            elapsed = max(m.elapsed_s, 1e-9)
            stats = summarize(m.samples, elapsed)
            latencies = [s.latency_s * 1000 for s in m.samples if s.ok]
            out["lanes"][lane or "load"] = {
                "stats": dataclasses.asdict(stats),
                "cdf_ms": cdf_ms(latencies),
                "timeline": timeline(m.samples, m.start_s, elapsed),
            }
        out["metrics"] = metrics
        out["hosts"] = {h.name: self.places[h.name].address for h in self.topo.hosts}
        out["delays_ms"] = {f"{k.a}-{k.b}": k.delay_ms for k in self.topo.links}
        out["delay_by"] = self.links.way
        out["roles"] = self.commands
        return out
