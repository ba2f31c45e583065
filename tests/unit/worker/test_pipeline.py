"""ResultPipeline on CPU: launch then collect gives what embed + finalize give, per group,
in order; bad input raises at launch; the device-time accounting never double counts."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from mesh.worker.engine.outputs import finalize
from mesh.worker.engine.runner import EngineBatch, EngineOutputs
from mesh.worker.pipeline import Launched, ResultPipeline, _Slot
from proto_msgs import BatchAssign, OutputOptions


class FixedEngine:
    """Pooled vectors that depend on the input, so a mix-up between batches shows."""

    device = torch.device("cpu")
    has_lexical = False

    def run(self, batch: EngineBatch) -> EngineOutputs:
        # Only a skip the batch has is passed on, so that fakes without prompts take none.
        args = () if batch.skip is None else (batch.skip,)
        return EngineOutputs(self.embed(batch.ids, batch.offsets, *args))

    def __init__(self, dims: int = 12, delay_s: float = 0.0) -> None:
        self.dims = dims
        self.delay_s = delay_s

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        time.sleep(self.delay_s)
        sums = np.add.reduceat(ids.astype(np.float64), offsets[:-1])
        basis = torch.linspace(-1.0, 1.0, self.dims, dtype=torch.float64)
        return (torch.from_numpy(sums)[:, None] * basis[None, :] + basis).float()


def batch(batch_id: int, lengths: list[int], outputs: list[OutputOptions], index: list[int]):
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = (np.arange(offsets[-1], dtype=np.int32) * 7 + batch_id) % 1000
    return BatchAssign(
        batch_id=batch_id,
        model="m",
        timeout_ms=1000,
        outputs=outputs,
        output_index=np.array(index, dtype=np.int32),
        token_ids=ids,
        offsets=offsets,
    )


def test_results_match_embed_and_finalize_per_group() -> None:
    engine = FixedEngine()
    pipe = ResultPipeline(engine, engine.device)
    outputs = [OutputOptions(), OutputOptions(dims=5, kind="int8"), OutputOptions(kind="binary")]
    b = batch(3, [4, 2, 7, 1, 3], outputs, [0, 1, 0, 2, 1])
    results, ms = pipe.collect(pipe.launch(b))
    pooled = engine.embed(b.token_ids, b.offsets)
    for g, out in enumerate(outputs):
        rows = torch.from_numpy(np.flatnonzero(b.output_index == g))
        want = finalize(pooled[rows], out.dims, out.normalize, out.kind)
        assert results[g].dtype == want.dtype
        np.testing.assert_array_equal(results[g], want)
    assert ms >= 0


def test_batches_collected_in_order_keep_their_own_results() -> None:
    engine = FixedEngine()
    pipe = ResultPipeline(engine, engine.device)
    batches = [batch(i, [3 + i, 5], [OutputOptions()], [0, 0]) for i in range(4)]
    launched = [pipe.launch(b) for b in batches]
    for b, item in zip(batches, launched, strict=True):
        got, _ = pipe.collect(item)
        want = finalize(engine.embed(b.token_ids, b.offsets), None, True)
        np.testing.assert_array_equal(got[0], want)
        assert item.batch_id == b.batch_id


def test_dims_over_the_model_raise_value_error_at_launch() -> None:
    engine = FixedEngine(dims=8)
    pipe = ResultPipeline(engine, engine.device)
    with pytest.raises(ValueError, match="dims"):
        pipe.launch(batch(1, [2], [OutputOptions(dims=9)], [0]))


def test_device_time_is_not_counted_twice() -> None:
    # Two batches launched back to back and collected later: the second one's time starts
    # when the first one finished, so the two together never exceed the wall clock.
    engine = FixedEngine(delay_s=0.02)
    pipe = ResultPipeline(engine, engine.device)
    t = time.perf_counter()
    a = pipe.launch(batch(1, [2], [OutputOptions()], [0]))
    b = pipe.launch(batch(2, [2], [OutputOptions()], [0]))
    time.sleep(0.03)
    (_, ms_a), (_, ms_b) = pipe.collect(a), pipe.collect(b)
    wall_ms = (time.perf_counter() - t) * 1000
    assert ms_a >= 40  # both forwards ran before the first collect on CPU
    assert ms_a + ms_b <= wall_ms + 1e-6


def test_slot_views_are_aligned_and_grow() -> None:
    slot = _Slot(pinned=False)
    outs = [torch.zeros(3, 5), torch.zeros(7, 3, dtype=torch.uint8), torch.zeros(2, 2)]
    views = slot.views(outs)
    assert [v.shape for v in views] == [o.shape for o in outs]
    assert [v.dtype for v in views] == [o.dtype for o in outs]
    starts = [v.data_ptr() - slot.buf.data_ptr() for v in views]
    assert starts == [0, 64, 128]
    small = slot.buf
    big = slot.views([torch.zeros(1 << 19)])  # 2 MiB: over the first 1 MiB buffer
    assert slot.buf.numel() >= 1 << 21 and slot.buf is not small and big[0].numel() == 1 << 19


def test_a_launch_waiting_for_a_slot_gives_up_when_the_worker_stops() -> None:
    # CUDA bookkeeping on CPU tensors: every slot taken (a finisher that died, a hung
    # device), then stop: the launch must not block the compute thread for good.
    import threading

    engine = FixedEngine()
    pipe = ResultPipeline(engine, torch.device("cuda"), depth=1)
    pipe._slots = threading.Semaphore(0)
    threading.Timer(0.2, pipe.stopping.set).start()
    with pytest.raises(RuntimeError, match="stopping"):
        pipe.launch(batch(1, [2], [OutputOptions()], [0]))


class SkipRecordingEngine(FixedEngine):
    def __init__(self) -> None:
        super().__init__()
        self.skips: list[np.ndarray | None] = []

    def embed(self, ids, offsets, skip=None) -> torch.Tensor:
        self.skips.append(skip)
        return super().embed(ids, offsets)


def test_each_sequence_gets_its_groups_pool_skip_and_none_when_no_group_skips() -> None:
    engine = SkipRecordingEngine()
    pipe = ResultPipeline(engine, engine.device)
    outputs = [OutputOptions(pool_skip=2), OutputOptions(), OutputOptions(pool_skip=3)]
    pipe.collect(pipe.launch(batch(1, [4, 5, 6, 7], outputs, [0, 1, 2, 0])))
    pipe.collect(pipe.launch(batch(2, [4, 5], [OutputOptions()], [0, 0])))
    assert engine.skips[0].tolist() == [2, 0, 3, 2] and engine.skips[1] is None


class CountingEvent:
    """A CUDA event stand-in: done after ``polls`` queries; records how it was waited on."""

    def __init__(self, polls: int) -> None:
        self.polls, self.queries, self.synchronized = polls, 0, False

    def query(self) -> bool:
        self.queries += 1
        return self.queries > self.polls

    def synchronize(self) -> None:
        self.synchronized = True


@pytest.mark.parametrize(("spin_s", "polls", "want_queries"), [(0.0, 3, 0), (1.0, 3, 4)])
def test_collect_polls_its_event_only_when_asked_to_spin(
    spin_s: float, polls: int, want_queries: int
) -> None:
    pipeline = ResultPipeline(FixedEngine(), torch.device("cpu"))
    event = CountingEvent(polls)
    launched = Launched(1, time.perf_counter(), [torch.ones(2, 3)], done=event)  # type: ignore[arg-type]
    results, _ = pipeline.collect(launched, spin_s)
    # Spinning ends at the first query that finds the event done; the sleep-wait after it
    # then returns at once, and the results are the same either way.
    assert event.queries == want_queries and event.synchronized
    assert results[0].tolist() == [[1.0] * 3] * 2


def test_a_spin_gives_up_at_its_bound_and_sleeps_on_the_event() -> None:
    pipeline = ResultPipeline(FixedEngine(), torch.device("cpu"))
    event = CountingEvent(polls=10**9)  # never done by polling
    launched = Launched(1, time.perf_counter(), [torch.zeros(1, 1)], done=event)  # type: ignore[arg-type]
    pipeline.collect(launched, spin_s=0.005)
    assert event.synchronized and 0 < event.queries < 10**9


class _OnceFaulty:
    """A CUDA event stand-in whose first wait raises (a device fault that does not stick)."""

    def __init__(self) -> None:
        self.waits = 0

    def synchronize(self) -> None:
        self.waits += 1
        if self.waits == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def query(self) -> bool:
        return True


def test_a_fault_seen_by_wait_is_raised_by_collect_even_if_it_does_not_raise_twice() -> None:
    pipe = ResultPipeline(FixedEngine(), torch.device("cpu"))
    launched = Launched(1, time.perf_counter(), [torch.zeros(2)], done=_OnceFaulty())  # type: ignore[arg-type]
    pipe.wait(launched)  # the finisher's wait before the live gate: it must not raise here
    assert launched.fault is not None and launched.done_at > 0
    with pytest.raises(RuntimeError, match="illegal memory access"):
        pipe.collect(launched)


def test_wait_then_collect_gives_the_results_and_ends_the_device_time_at_the_wait() -> None:
    pipe = ResultPipeline(FixedEngine(), torch.device("cpu"))
    event = _OnceFaulty()
    event.waits = 1  # healthy from here on
    launched = Launched(1, time.perf_counter(), [torch.arange(3.0)], done=event)  # type: ignore[arg-type]
    pipe.wait(launched)
    done_at = launched.done_at
    results, _ms = pipe.collect(launched)
    np.testing.assert_array_equal(results[0], [0.0, 1.0, 2.0])
    # The next batch's device time starts where this one's ended: at the wait, not at collect.
    assert pipe._last_done == done_at
