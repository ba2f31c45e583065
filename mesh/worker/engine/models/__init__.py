"""Our model code, one file per family, the blocks they share written once.

- :mod:`.registry`: ``model_type`` -> family, its checkpoint prefixes and defaults; imports
  no torch (the card reads it).
- :mod:`.blocks`: norms, activations, rotary positions, MLP variants, fused QKV splitting,
  the attention call (with a bias or window for the families that need one), post-LN
  wiring.
- one file per family, each reading its config, naming the weights it takes and wiring the
  blocks: :mod:`.bert` (BERT), :mod:`.xlm_roberta` (XLM-RoBERTa, RoBERTa), :mod:`.mpnet`,
  :mod:`.modernbert`, :mod:`.nomic` (NomicBERT, the new GTE), :mod:`.decoder` (Qwen3, Qwen2,
  Mistral), :mod:`.gemma3`. Every model is ``forward(ids[T], positions[T], attn) -> [T,
  hidden]`` with ``num_heads``, ``num_kv_heads``, ``head_dim``, ``dtype``, ``vocab_size``,
  ``needs_masks`` (with ``mask_free_length`` where it does: the longest sequence that needs
  no mask, None for never) and ``use_kernels("torch" | "compile" | "fused", exact_gelu)``, which
  returns the kernels it runs; an option it does not implement is refused at construction
  with NotImplementedError naming it.
"""
