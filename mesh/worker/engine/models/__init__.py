"""Our model code, one file per family, on one base, the blocks they share written once.

- :mod:`.base`: :class:`~.base.PackedEncoder`, the ``nn.Module`` every family subclasses:
  the shared config fields read once (:class:`~.base.ModelShape`), and typed declarations of
  what the runners and heads ask (``heads``, ``windows``, ``position_bias``,
  ``needs_masks``, ``mask_free_length``, ``eager_only``, ``use_kernels``,
  ``fold_pair_types``, ``word_table``). A family implements ``build(config, weights)`` and
  ``forward(ids[T], positions[T], attn) -> [T, hidden]``.
- :mod:`.registry`: ``model_type`` -> family, its checkpoint prefixes and defaults; imports
  no torch (the card reads it).
- :mod:`.blocks`: norms, activations, rotary positions (per layer kind too), MLP variants,
  fused QKV splitting, post-LN wiring.
- one file per family, each reading what else its config says, naming the weights it takes
  and wiring the blocks: :mod:`.bert` (BERT), :mod:`.xlm_roberta` (XLM-RoBERTa, RoBERTa),
  :mod:`.mpnet`, :mod:`.modernbert`, :mod:`.nomic` (NomicBERT, the new GTE), :mod:`.decoder`
  (Qwen3, Qwen2, Mistral), :mod:`.gemma3`. An option a family does not implement is refused
  at construction with NotImplementedError naming it.
"""
