"""The /studio API described for show-control tools (issue 48, item 3): `GET /studio/openapi.json`,
an OpenAPI 3 document of every /studio route (and /metrics), and `GET /studio/api`, a page that
lists them, made here from that document: no script, no style sheet or font from another
server (the page asks nobody but the server, as every page of this app). Both sit behind the
publish credential like the routes they describe; FastAPI's own /docs and /openapi.json stay
off under a login, since FastAPI serves them to anyone.
"""

from __future__ import annotations

import html

from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse

PREFIXES = ("/studio", "/metrics")


def studio_openapi(app) -> dict:
    """The app's OpenAPI document with only the /studio routes and /metrics."""
    routes = [r for r in app.routes if getattr(r, "path", "").startswith(PREFIXES)]
    doc = get_openapi(title="StreamStudio control API", version="1", routes=routes,
                      description="Live streams, their settings, outputs, modulations and tempo, the replicas "
                                  "(docs/webapp.md). Send the publish credential: Authorization: Bearer TOKEN.")
    doc["components"] = {**doc.get("components", {}), "securitySchemes": {
        "publish": {"type": "http", "scheme": "bearer", "description": "serve --whip-token, or the --auth login"}}}
    doc["security"] = [{"publish": []}]
    return doc


def page(doc: dict) -> str:
    """An HTML page listing every operation of `doc`: method, path, summary, body and parameters."""
    rows = []
    for path, item in sorted(doc.get("paths", {}).items()):
        for method, op in item.items():
            params = ", ".join(p["name"] for p in op.get("parameters", []))
            body = "JSON body" if "requestBody" in op else ""
            text = html.escape(op.get("description") or op.get("summary") or "")
            rows.append(f"<tr><td><code>{method.upper()}</code></td><td><code>{html.escape(path)}</code></td>"
                        f"<td>{html.escape(params)}</td><td>{body}</td><td>{text}</td></tr>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>StreamStudio control API</title></head>"
            "<body><h1>StreamStudio control API</h1><p>The whole document: <a href='/studio/openapi.json'>"
            "/studio/openapi.json</a> (OpenAPI 3). Every route needs the publish credential.</p>"
            "<table border='1' cellpadding='4'><tr><th>method</th><th>path</th><th>parameters</th><th>body</th>"
            f"<th>what it does</th></tr>{''.join(rows)}</table></body></html>")


def mount(app) -> None:
    @app.get("/studio/openapi.json", tags=["studio"], include_in_schema=False)
    async def openapi():
        return JSONResponse(studio_openapi(app))

    @app.get("/studio/api", tags=["studio"], include_in_schema=False)
    async def api_page():
        return HTMLResponse(page(studio_openapi(app)))
