"""The ingress (REST bridge): OpenAI-compatible HTTP in front of the mesh.

``app`` (routes, middlewares, ``create_app``), ``schema`` (request parsing), ``encodings``
(response bodies), ``http_errors`` (status codes and the error shape), ``catalog`` (models
served and ever seen, health), ``metrics`` (Prometheus), ``server`` (``serve``: run it).
"""
