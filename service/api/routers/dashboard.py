"""The dashboard: a static page at ``/`` and its script and style under ``/dashboard/``.

The page holds no data, so it needs no key: the script asks for an API key, keeps it in the tab's
``sessionStorage`` (gone when the tab closes, never written to disk or put in a URL) and sends it as a bearer
header with every ``fetch`` to ``/v1/...``, as any other client does. A revoked or wrong key gets the same 401
there as anywhere else, and the page asks again.

The files ship inside the package (``service/dashboard/``, package data), so nothing is fetched from a CDN and
the page works on a machine without internet. They are read once, at import. Only the names listed in
:data:`FILES` are served (no path from the request ever reaches the filesystem). A strict
Content-Security-Policy lets the page run only its own script and talk only to its own origin, so even a job
name crafted as HTML could not run code (the script also renders every value as text, never as markup).

The page is a console as well as a view (submit, cancel, retry, logs, artifacts, schedules), all through the
same ``/v1`` API with the same key. Nothing it needs widens the policy: a published file is fetched with the key
and shown as text or saved from a ``blob:`` URL the page makes (a navigation, which no fetch directive
governs), so ``img-src`` no longer admits ``data:`` and the page may load nothing from anywhere but itself.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException, Response, status

router = APIRouter(include_in_schema=False)

#: the dashboard's files and their media types
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_CONTENT = {name: (resources.files("service.dashboard") / name).read_bytes() for name in FILES}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # revalidate each time, so a new release's script is never paired with an old page
    "Cache-Control": "no-cache",
}


def _file(name: str) -> Response:
    if name not in FILES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "Not Found")
    return Response(_CONTENT[name], media_type=FILES[name], headers=HEADERS)


@router.get("/")
def page() -> Response:
    return _file("index.html")


@router.get("/dashboard/{name}")
def asset(name: str) -> Response:
    return _file(name)
