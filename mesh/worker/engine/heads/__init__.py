"""What leaves the model: pooling, sentence-transformers Dense layers, a cross-encoder's
classifier, SPLADE and bge-m3 lexical weights, multi-vector (ColBERT) projections and late
interaction layouts, span means. Each head takes the final hidden states (or pooled rows)
on the device; :class:`mesh.worker.engine.runner.OutputHeads` applies them in order."""
