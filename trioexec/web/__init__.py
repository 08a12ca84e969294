"""The web dashboard (API §11): ``trioexec dashboard DB|URL`` (extra ``web``).

A Starlette app (ASGI, on Trio through anyio) served by Hypercorn's Trio worker:
server-rendered Jinja2 pages (autoescaped), inline SVG charts drawn on the server, one
static script for live updates (Server-Sent Events). Pages read the store read-only,
in worker threads; actions open it writable, behind the token, a CSRF field and an
Origin check.
"""

from ._app import create_app as create_app
from ._serve import serve as serve

__all__ = ["create_app", "serve"]
