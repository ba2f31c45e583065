"""``mesh-embed``: embed a file of texts through any OpenAI-compatible ``/v1/embeddings``.

Input rows are streamed (``sources``), sent in batches with a bounded window of requests in
flight (``client``, ``pipeline``), and written in input order to a streamed output (``sinks``)
whose durable prefix a sidecar progress file records (``progress``), so that ``--resume``
finishes an interrupted run without starting over. The command line is ``cli``.
"""
