"""Cross-encoders: our engine's logits equal transformers' ``BertForSequenceClassification``
and, through the card's activation, sentence-transformers ``CrossEncoder.predict``, for pairs
(token type 1 on the passage) and single texts, with one label and with three; the card says
what the model does; heads, families and activations not served are refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.client.pairs import encode_inputs, longest_first
from mesh.client.scores import activate
from mesh.client.tokenize import ModelTokenizer
from mesh.errors import InvalidInput
from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine
from proto_msgs import ModelInfo
from tests.st_models import MAX_TOKENS, build_cross_encoder

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

QUERY = "how do cross encoders score a passage"
PASSAGES = [
    "A cross-encoder reads the query and the passage together and outputs a relevance score.",
    "Bananas are rich in potassium.",
    "score",
    "The encoder attends over both texts at once, so every token of the passage sees the query "
    "and the other way round; that is why it ranks better than comparing two embeddings.",
]
SINGLES = ["just one text", "another single input with more words in it"]


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("ce") / "ce", num_labels=1)


@pytest.fixture(scope="module", params=[1, 3], ids=["1-label", "3-labels"])
def model_dir(
    request: pytest.FixtureRequest, reranker_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    if request.param == 1:
        return reranker_dir
    return build_cross_encoder(tmp_path_factory.mktemp("ce") / "cls", num_labels=request.param)


def _tokenizer(card_dir: Path) -> ModelTokenizer:
    card = read_card(card_dir)
    info = ModelInfo(card.name, [], card.dims, card.max_input_tokens, 30522, card.pooling,
                     card.normalize, card.tokenizer_digest)  # fmt: skip
    return ModelTokenizer(card.tokenizer_json, info)


def _logits(engine: Engine, tok: ModelTokenizer, inputs: list) -> np.ndarray:
    ids, lengths, starts = encode_inputs(tok, inputs, truncate=True)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return engine.embed(ids, offsets, pairs=starts).numpy()


def test_the_card_says_the_model_scores_with_its_labels(model_dir: Path) -> None:
    card = read_card(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    assert card.task == "score" and card.pooling == "cls" and not card.normalize
    assert card.dims == len(card.labels) == len(config["id2label"])
    assert card.labels == [config["id2label"][str(i)] for i in range(card.dims)]
    # The CrossEncoder saved its default: Sigmoid for one label, Identity for several.
    assert card.activation == ("sigmoid" if card.dims == 1 else "identity")


def test_scores_equal_cross_encoder_predict(model_dir: Path) -> None:
    engine = Engine.load(model_dir)
    tok = _tokenizer(model_dir)
    ce = st.CrossEncoder(str(model_dir), device="cpu", max_length=MAX_TOKENS)
    pairs = [(QUERY, p) for p in PASSAGES]
    ours = activate(_logits(engine, tok, pairs), engine.card.activation)
    ref = np.asarray(ce.predict(pairs, batch_size=2), dtype=np.float32).reshape(len(pairs), -1)
    np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=1e-4)


def test_logits_equal_transformers_for_pairs_and_single_texts(model_dir: Path) -> None:
    engine = Engine.load(model_dir)
    tok = _tokenizer(model_dir)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    # Pairs and singles in one packed batch: the types are per sequence.
    inputs = [(QUERY, p) for p in PASSAGES] + SINGLES
    ours = _logits(engine, tok, inputs)
    for i, x in enumerate(inputs):
        enc = (
            hf_tok(*x, return_tensors="pt")
            if isinstance(x, tuple)
            else hf_tok(x, return_tensors="pt")
        )
        with torch.no_grad():
            ref = hf(**enc).logits[0].numpy()
        np.testing.assert_allclose(ours[i], ref, atol=2e-5, rtol=1e-4)
    # The pair's second segment matters: the same ids all typed 0 score otherwise.
    ids, lengths, starts = encode_inputs(tok, inputs[:1], truncate=True)
    offsets = np.array([0, lengths[0]], dtype=np.int32)
    assert starts[0] > 0
    typed0 = engine.embed(ids, offsets).numpy()
    assert not np.allclose(typed0[0], ours[0], atol=1e-3)


def test_pairs_over_the_limit_are_truncated_longest_first_as_the_tokenizer_does(
    reranker_dir: Path,
) -> None:
    tok = _tokenizer(reranker_dir)
    hf_tok = transformers.AutoTokenizer.from_pretrained(reranker_dir)
    long = " ".join(["passage"] * 400)
    longer = " ".join(f"p{i}" for i in range(1000))
    assert len(longer) > tok.cut_chars  # cut before tokenizing, to its first characters
    for pair in [(QUERY, long), (long, QUERY), (long, long + " tail"), (QUERY, longer)]:
        ids, lengths, starts = encode_inputs(tok, [pair], truncate=True)
        ref = hf_tok(*pair, truncation="longest_first", max_length=MAX_TOKENS)
        assert ids.tolist() == ref["input_ids"]
        assert starts[0] == ref["token_type_ids"].index(1)
    with pytest.raises(InvalidInput, match="input\\[0\\] has more than"):
        encode_inputs(tok, [(QUERY, long)], truncate=False)
    # From the left, as TEI's truncation_direction "Left": each text loses its first tokens.
    hf_tok.truncation_side = "left"
    long = " ".join(f"w{i}" for i in range(1000))
    assert len(long) > tok.cut_chars  # cut before tokenizing, to its last characters
    for pair in [(QUERY, long), (long, long + " tail"), (long[:900], QUERY)]:
        ids, lengths, starts = encode_inputs(tok, [pair], truncate=True, left=True)
        ref = hf_tok(*pair, truncation="longest_first", max_length=MAX_TOKENS)
        assert ids.tolist() == ref["input_ids"]
        assert starts[0] == ref["token_type_ids"].index(1)


def test_pairs_to_an_embedder_and_splits_outside_a_sequence_are_refused(model_dir: Path) -> None:
    engine = Engine.load(model_dir)
    ids = np.arange(1, 9, dtype=np.int32)
    offsets = np.array([0, 4, 8], dtype=np.int32)
    with pytest.raises(ValueError, match="inside its sequence"):
        engine.embed(ids, offsets, pairs=np.array([2, 4], dtype=np.int32))


def _edited(src: Path, dst: Path, config: dict | None = None, st_cfg: dict | None = None) -> Path:
    shutil.copytree(src, dst)
    for name, changes in (("config.json", config), ("config_sentence_transformers.json", st_cfg)):
        if changes:
            doc = json.loads((dst / name).read_text())
            doc.update(changes)
            (dst / name).write_text(json.dumps(doc))
    return dst


def test_heads_and_activations_not_served_are_refused_by_name(
    model_dir: Path, tmp_path: Path
) -> None:
    relu = _edited(model_dir, tmp_path / "relu", st_cfg={"activation_fn": "torch.nn.ReLU"})
    with pytest.raises(ValueError, match="activation 'torch.nn.ReLU' is not supported"):
        read_card(relu)
    other = _edited(
        model_dir, tmp_path / "distil", config={"architectures": ["BertForTokenClassificationX"]}
    )
    assert read_card(other).task == "embed"  # not a sequence classifier: an encoder as before
    odd = _edited(
        model_dir, tmp_path / "odd", config={"architectures": ["ElectraForSequenceClassification"]}
    )
    with pytest.raises(ValueError, match="'ElectraForSequenceClassification' is not served"):
        read_card(odd)


def test_without_a_configured_activation_tei_rule_applies(model_dir: Path, tmp_path: Path) -> None:
    plain = _edited(model_dir, tmp_path / "plain")
    (plain / "config_sentence_transformers.json").unlink()
    card = read_card(plain)
    assert card.activation == ("sigmoid" if card.dims == 1 else "softmax")
    logits = np.array([[0.0, 1.0, 2.0], [800.0, -800.0, 0.0]], dtype=np.float32)
    soft = activate(logits, "softmax")
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(activate(logits, "sigmoid")[1, :2], [1.0, 0.0])


@pytest.mark.parametrize(
    "cls_name", ["XLMRobertaForSequenceClassification", "MPNetForSequenceClassification"]
)
def test_roberta_style_heads_equal_transformers(cls_name: str, tmp_path: Path) -> None:
    from engine_helpers import pack, random_seqs, randomize, save_model_dir

    vocab = 300
    kind = "XLMRoberta" if cls_name.startswith("XLM") else "MPNet"
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
        num_labels=2,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = getattr(transformers, cls_name)(config).eval()
    randomize(hf, seed=41)
    engine = Engine.load(save_model_dir(hf, tmp_path / kind, vocab))
    assert (engine.card.task, engine.card.dims, engine.card.activation) == ("score", 2, "softmax")
    seqs = random_seqs(vocab, [7, 30, 3, 64], seed=42)
    seqs = [[0] + [max(t, 3) for t in s] + [2] for s in seqs]  # <s> ... </s>, no pad inside
    ids, offsets = pack(seqs)
    # One token type: a pair's split changes nothing, as in transformers (types all 0).
    ours = engine.embed(ids, offsets, pairs=np.array([3, 0, 2, 10], dtype=np.int32)).numpy()
    for i, s in enumerate(seqs):
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor([s])).logits[0].numpy()
        np.testing.assert_allclose(ours[i], ref, atol=2e-5, rtol=1e-4)


def test_longest_first_keeps_what_the_tokenizer_keeps(reranker_dir: Path) -> None:
    tok = _tokenizer(reranker_dir)
    hf_tok = transformers.AutoTokenizer.from_pretrained(reranker_dir)
    sizes = [0, 1, 40, 61, 62, 63, 64, 90, 125, 126, 200]
    for n1 in sizes:
        for n2 in sizes[1:]:  # transformers' Python side drops an empty second text
            pair = (" ".join(["a"] * n1), " ".join(["b"] * n2))
            ref = hf_tok(*pair, truncation="longest_first", max_length=MAX_TOKENS)
            kept = longest_first(n1, n2, MAX_TOKENS - 3)
            assert list(kept) == [ref["input_ids"].count(1037), ref["input_ids"].count(1038)]
            ids, _, starts = encode_inputs(tok, [pair], truncate=True)
            assert ids.tolist() == ref["input_ids"], (n1, n2)
            if 1 in ref["token_type_ids"]:
                assert starts[0] == ref["token_type_ids"].index(1)


@pytest.mark.parametrize(
    ("config", "activation"),
    [
        # sentence-transformers 3-4 wrote it into config.json, older releases under another key.
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}, "tanh"),
        ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, "identity"),
    ],
)
def test_older_cross_encoder_layouts_name_their_activation(
    reranker_dir: Path, tmp_path: Path, config: dict, activation: str
) -> None:
    older = _edited(reranker_dir, tmp_path / "older", config=config)
    (older / "config_sentence_transformers.json").unlink()
    assert read_card(older).activation == activation
