"""The web dashboard (API §11): ``trioexec dashboard DB|URL`` (extra ``web``).

A Starlette application (ASGI; it runs on Trio through anyio) served by
Hypercorn's Trio worker: server-rendered pages (Jinja2, autoescaped), inline SVG
charts drawn on the server, one small static script for live updates by
Server-Sent Events. The store is read read-only, in worker threads; actions open
it writable, each behind the token, a CSRF field and an Origin check.
"""

from ._app import create_app as create_app
from ._serve import serve as serve

__all__ = ["create_app", "serve"]
