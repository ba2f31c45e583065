"""The worker's model engine: model card, weights, our own model code, pooling, outputs.

Import the submodules directly (``mesh.worker.engine.engine.Engine``,
``mesh.worker.engine.card.read_card``): this package imports nothing itself, so that
reading a model card does not pull in torch.
"""
