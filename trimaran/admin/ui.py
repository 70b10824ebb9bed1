"""The management page: static HTML, CSS and one script over ``/api/v1``, served at ``/ui``.

The files ship inside the package (no build step, no CDN); the page asks for a bearer token and
calls the same API as the CLI, so it can do nothing the token could not. The files are public (no
secret in them); every call they make is authenticated. Responses forbid framing and inline scripts.
"""

from __future__ import annotations

from importlib import resources

from trimaran.admin.http import HttpError, HttpServer, Request, Response

FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = [
    ("cache-control", "no-cache"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
]


def asset(name: str) -> bytes:
    return resources.files("trimaran.admin").joinpath("ui", name).read_bytes()


async def _page(_request: Request) -> Response:
    return _file("index.html")


async def _asset(request: Request) -> Response:
    name = request.params["file"]
    if name not in FILES:
        raise HttpError(404, "not_found", f"no file {name} in the management page")
    return _file(name)


def _file(name: str) -> Response:
    return Response(200, asset(name), FILES[name], list(SECURITY_HEADERS))


def register(server: HttpServer) -> None:
    server.route("GET", "/ui", _page)  # "/ui/" too: the router ignores empty segments
    server.route("GET", "/ui/{file}", _asset)
