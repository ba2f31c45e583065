"""The worker's model engine, by part:

- the runner: :mod:`.engine` (``Engine.load``, the one entry ``Engine.run``), :mod:`.runner`
  (the batch and output types, the heads in order, the eager forward), :mod:`.cpu` and
  :mod:`.gpu` (what differs by device: staging, CUDA graphs, allocator tuning);
- :mod:`.weights` (safetensors, checkpoint prefixes) and :mod:`.loader` (a model directory
  to its family's module);
- :mod:`.models`: the model base, the registry, the shared blocks and one file per family;
- :mod:`.heads`: pooling, Dense, classifier, SPLADE, lexical, multi-vector, spans;
- :mod:`.kernels`: the attention backends and the fused Triton kernels;
- :mod:`.card`, :mod:`.st_config`, :mod:`.outputs`: what the mesh is told about a model,
  its sentence-transformers layout, and the encodings of the vectors.

Import the submodules directly (``mesh.worker.engine.engine.Engine``,
``mesh.worker.engine.card.read_card``): this package imports nothing itself.
"""
