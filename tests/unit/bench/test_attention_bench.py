"""mesh-bench attention's pure parts: the workload, the family shapes, no CUDA no run."""

from __future__ import annotations

import pytest

from bench.harness import attention


def test_the_batch_fills_the_token_budget_with_lengths_the_family_takes() -> None:
    lengths = attention._lengths(16384, 300, seed=1)
    assert 16384 - 300 < sum(lengths) <= 16384
    assert max(lengths) == 300 and min(lengths) >= 8
    assert lengths == attention._lengths(16384, 300, seed=1)  # the same batch every run


@pytest.mark.parametrize("name", list(attention.SHAPES))
def test_each_family_s_layers_say_which_take_a_window(name: str) -> None:
    shape = attention.SHAPES[name]
    windows = shape.layer_windows()
    assert len(windows) == shape.layers
    if shape.window is None:
        assert windows == [None] * shape.layers
    else:  # local layers take it, and at least the last layer is global
        assert windows[-1] is None and windows.count(shape.window) == len(shape.windowed) > 0


def test_without_cuda_it_says_so_and_exits_2(tmp_path, capsys) -> None:
    if attention.torch.cuda.is_available():
        pytest.skip("a CUDA machine runs it for real")
    assert attention.main(["--json", str(tmp_path / "out.json")]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_on_a_cpu_it_checks_every_step_and_reports_each_backend(tmp_path) -> None:
    import json

    out = tmp_path / "out.json"
    argv = ["--json", str(out), "--device", "cpu", "--families", "mpnet-base",
            "--backends", "sdpa-grouped,flashinfer", "--tokens", "300", "--repeats", "1",
            "--warmup", "0"]  # fmt: skip
    assert attention.main(argv) == 0
    results = {r["backend"]: r for r in json.loads(out.read_text())["results"]}
    grouped = results["sdpa-grouped"]
    assert grouped["error"] is None and grouped["min_cos"] > 0.9999 and grouped["eager_ms"] > 0
    assert grouped["attention_gflop"] > 0
    assert results["flashinfer"]["error"]  # no FlashInfer here (or no bias there): said, not fatal


def test_a_backend_whose_output_holds_a_nan_fails_the_check() -> None:
    import math

    import torch

    reference = [torch.ones(4, 2, 8)]
    bad = reference[0].clone()
    bad[2, 1, 3] = math.nan
    assert math.isnan(attention._check([bad], reference, [0]))
    assert attention._check([reference[0].clone()], reference, [0]) > 0.9999
    # Padded capacity rows past the batch's are not compared.
    padded = torch.cat([reference[0], torch.full((3, 2, 8), math.nan)])
    assert attention._check([padded], reference, [0]) > 0.9999
