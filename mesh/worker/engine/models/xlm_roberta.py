"""XLM-RoBERTa and RoBERTa encoders (bge-m3, multilingual-e5, all-distilroberta) over packed
batches.

BERT's layers unchanged (:class:`.bert.BertLayer`, so the fused CUDA path and graphs too);
what differs is where positions start. As Hugging Face's
``create_position_ids_from_input_ids``, a token's row in the position table is
``padding_idx + 1 +`` the number of non-pad tokens before it in its sequence, and a pad
token's row is ``padding_idx`` itself (``padding_idx`` is the config's ``pad_token_id``, 1
for every released checkpoint). A text never carries pad tokens from the ingress, but token
ids sent by a client may, and the reference would place them so: computed here over the
packed batch without a host sync (graph-capturable). One token type (``type_vocab_size`` 1):
its row is folded in as BERT's. Checkpoints saved by ``*ForMaskedLM`` carry ``roberta.``.
"""

from __future__ import annotations

from typing import Any

import torch

from mesh.worker.engine.models.bert import BertEncoder


class XLMRobertaEncoder(BertEncoder):
    family = "xlm-roberta"

    @classmethod
    def padding_index(cls, config: dict[str, Any]) -> int:
        pad = config.get("pad_token_id")
        return 1 if pad is None else int(pad)

    def position_ids(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        real = (ids != self.pad).long()
        seen = real.cumsum(0)  # non-pad tokens up to each one, over the whole batch
        start = torch.arange(ids.shape[0], device=ids.device) - positions
        # Less those before the token's own sequence began.
        count = seen - (seen[start] - real[start])
        return count * real + self.pad
