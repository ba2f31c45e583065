"""The ingress (REST bridge): OpenAI- and TEI-compatible HTTP in front of the mesh.

``app`` (routes, middlewares, ``create_app``), ``tei`` (TEI's routes, with ``tei_schema`` and
``tei_tokens``), ``state`` (what the route families share), ``schema`` (request parsing),
``encodings`` (response bodies), ``http_errors`` (status codes and the error shapes),
``catalog`` (models served and ever seen, health), ``metrics`` (Prometheus), ``server``
(``serve``: run it).
"""
