"""mesh-bench: load generators, the in-process baseline and reports (see ``bench.cli``)."""
