"""ColBERT's per-token vectors as colbert-ai and PyLate compute them (``colbert_reference``),
written here from their tokenization and encoding (tokenize cut at length - 1, marker after
[CLS], queries padded with [MASK] and an attention mask of 0 on them unless attended to,
linear, L2 per token, skiplist tokens dropped from documents) over transformers' own
tokenizer and BertModel: nothing of ours. For the checkpoints ``tests.st_models`` builds.
``served_vectors`` is ours to compare with it: the ingress's layout through an engine."""

from __future__ import annotations

import string

import numpy as np
import torch
from safetensors.torch import load_file

from mesh.client.late_interaction import layout
from mesh.client.tokenize import ModelTokenizer
from proto_msgs import ModelInfo
from tests.st_models import ColbertSpec

DEFAULT = ColbertSpec()


def colbert_reference(model_dir, texts, query, spec=DEFAULT):
    """Per text, float32 [vectors, dim] and the ids they belong to, as the libraries compute."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    bert = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    pylate = (model_dir / "1_Dense").is_dir()
    if pylate:
        head = load_file(str(model_dir / "1_Dense" / "model.safetensors"))
        markers = tok.convert_tokens_to_ids(["[Q] ", "[D] "])
        skiplist = set(tok.convert_tokens_to_ids(list(string.punctuation)))
    else:
        head = load_file(str(model_dir / "model.safetensors"))
        markers = tok.convert_tokens_to_ids(["[unused0]", "[unused1]"])
        skiplist = {tok.encode(c, add_special_tokens=False)[0] for c in string.punctuation}
    weight, bias = head["linear.weight"], head.get("linear.bias")
    length = spec.query_length if query else spec.document_length
    out = []
    for text in texts:
        ids = tok(text, truncation=True, max_length=length - 1)["input_ids"]
        ids = [ids[0], markers[0] if query else markers[1], *ids[1:]]
        mask = [1] * len(ids)
        if query and spec.expansion:
            pad = length - len(ids)
            ids += [tok.mask_token_id] * pad
            mask += [int(spec.attend_to_expansion)] * pad
        with torch.no_grad():
            h = bert(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([mask]))[0][0]
            v = torch.nn.functional.linear(h, weight, bias)
            v = torch.nn.functional.normalize(v, dim=-1)
        keep = [True] * len(ids) if query else [i not in skiplist for i in ids]
        out.append((v[torch.tensor(keep)].numpy(), np.asarray(ids)[keep]))
    return out


def served_vectors(engine, texts, roles, truncate=True):  # noqa: ANN001, ANN201
    """Our ingress's layout of ``texts`` (``roles``: True for a query) as one packed batch
    through ``engine`` (``embed_with_spans``, the head, L2): per text, the vectors (float32,
    on the host) and the ids they belong to."""
    card = engine.card
    info = ModelInfo(card.name, [], card.dims, card.max_input_tokens, engine.vocab_size,
                     card.pooling, False, card.tokenizer_digest, hidden_size=engine.hidden_size,
                     multivector_dims=card.multivector.out_features,
                     late_interaction=card.colbert.tokens)  # fmt: skip
    tok = ModelTokenizer(card.tokenizer_json, info)
    parts = []
    for text, query in zip(texts, roles, strict=True):
        ids, lengths = tok.encode([text], truncate=True)
        parts.append(layout(tok, info.late_interaction, ids, lengths, query, truncate))
    ids = np.concatenate([p[0] for p in parts])
    lengths = np.concatenate([p[1] for p in parts])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    absolute = np.concatenate([p[2] + offsets[i] for i, p in enumerate(parts)])
    counts = [len(p[2]) for p in parts]
    _, rows = engine.embed_with_spans(ids, offsets, absolute)
    vectors = torch.nn.functional.normalize(engine.project_multivector(rows), dim=-1)
    vectors = vectors.float().cpu().numpy()
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [
        (vectors[bounds[i] : bounds[i + 1]], ids[absolute[bounds[i] : bounds[i + 1], 0]])
        for i in range(len(texts))
    ]
