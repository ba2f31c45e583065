"""``GET /openapi.json`` (``mesh.ingress.openapi``'s document) and ``GET /docs``, a Swagger UI page
that works offline: its scripts and styles come from the installed ``swagger-ui-bundle`` package
(``/docs/static/{name}``), never from a CDN, so an air-gapped deployment shows the same page.

These routes need no API key, as ``/health``: the description holds no secret (it says a key is
needed, not which), and a person or a generator reading the API should not need one to start.
The page's links are relative (``docs/static/...``, ``openapi.json``), so it also works behind a
proxy that serves the ingress under a path prefix; ``/docs/`` answers the same page, its links
written for that base (``static/...``, ``../openapi.json``).
"""

from __future__ import annotations

from pathlib import Path

import orjson
from aiohttp import web

from mesh.ingress.config import IngressConfig
from mesh.ingress.http_errors import ApiError
from mesh.ingress.openapi import document

# Only what the page loads: the package also ships source maps and ES bundles (~6 MB) that a
# browser never asks for here.
ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "application/javascript",
    "swagger-ui-standalone-preset.js": "application/javascript",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}

try:
    import swagger_ui_bundle

    ASSET_DIR: Path | None = Path(str(swagger_ui_bundle.swagger_ui_path))
except ImportError:
    # Run from a checkout on PYTHONPATH without pip (the GPU machine): the API serves and
    # /openapi.json too; only the page says what is missing (as tei.VERSION does for /info).
    ASSET_DIR = None

PAGE = b"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>embedmesh API</title>
<link rel="stylesheet" href="docs/static/swagger-ui.css">
<link rel="icon" type="image/png" href="docs/static/favicon-32x32.png" sizes="32x32">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/static/swagger-ui-bundle.js"></script>
<script src="docs/static/swagger-ui-standalone-preset.js"></script>
<script>
window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
  layout: "StandaloneLayout",
  validatorUrl: null
});
</script>
</body>
</html>
"""

# The same page for "/docs/": relative links resolve against the path's last "/".
SLASHED_PAGE = PAGE.replace(b"docs/static/", b"static/").replace(
    b'url: "openapi.json"', b'url: "../openapi.json"'
)

_DOCUMENT = web.AppKey("embedmesh_openapi", bytes)


def add_routes(app: web.Application, cfg: IngressConfig) -> None:
    # Built once: the document depends only on the settings, which do not change while serving.
    app[_DOCUMENT] = orjson.dumps(document(cfg))
    app.router.add_get("/openapi.json", _openapi, name="openapi")
    app.router.add_get("/docs", _page, name="docs")
    app.router.add_get("/docs/", _page, name="docs.slash")
    app.router.add_get("/docs/static/{name}", _asset, name="docs.static")


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[_DOCUMENT], content_type="application/json")


def _check_assets() -> Path:
    if ASSET_DIR is None:
        raise ApiError(
            503,
            "the /docs page's assets are not installed (pip install swagger-ui-bundle); "
            "the description itself is at /openapi.json",
            "server_error",
            "unavailable",
        )
    return ASSET_DIR


async def _page(request: web.Request) -> web.Response:
    _check_assets()
    # "docs/static/..." resolves against /docs's parent, "static/..." against /docs/ itself.
    page = SLASHED_PAGE if request.path.endswith("/") else PAGE
    return web.Response(body=page, content_type="text/html", charset="utf-8")


async def _asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in ASSETS:  # a fixed list: no path from the request reaches the file system
        raise web.HTTPNotFound()
    return web.FileResponse(
        _check_assets() / name,
        headers={"Content-Type": ASSETS[name], "Cache-Control": "public, max-age=86400"},
    )
