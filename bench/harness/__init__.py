"""The harnesses mesh-bench runs beside its HTTP load: soak, fuzz, rerank, families, the GPU
engine bench, model shapes and the GPU proof (``bench/cli.py``)."""
