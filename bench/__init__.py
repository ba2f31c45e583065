"""mesh-bench: the HTTP load benchmark and its harnesses (``bench.cli``, ``bench/README.md``)."""
