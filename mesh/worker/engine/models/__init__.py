"""Our model code, one file per family, the blocks they share written once.

- :mod:`.registry`: ``model_type`` -> family, its checkpoint prefixes and defaults; imports
  no torch (the card reads it).
- :mod:`.blocks`: norms, activations, rotary positions, MLP variants, fused QKV splitting,
  the attention call (with a bias or window for the families that need one), post-LN
  wiring.
- :mod:`.bert` (BERT), :mod:`.decoder` (Qwen3): each reads its config, declares the weight
  names it takes and wires the blocks. Every model is ``forward(ids[T], positions[T],
  attn) -> [T, hidden]`` with ``num_heads``, ``num_kv_heads``, ``head_dim``, ``dtype``,
  ``vocab_size``, ``needs_masks`` and ``use_kernels("torch" | "compile" | "fused")``.
"""
