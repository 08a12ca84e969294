"""Who may read and who may act: the token, CSRF, the Origin check, and the
headers every response carries.

The token is random per start and printed in the URL. A page visited with
``?token=T`` sets an HttpOnly, SameSite=Strict cookie (`cookie_name`, `cookie_value`)
and redirects to itself without it, so the token leaves the address bar and the
history. An action (a POST) needs that cookie, a CSRF field (an HMAC of the token: a
page from elsewhere cannot read the cookie, so it cannot compute the field) and, when
the browser sends one, an Origin of this server. Reads need the cookie when the server
listens beyond loopback or is asked for by a name that is not a loopback one (a
reverse proxy's, or a rebound one: `Guard.may_read`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import urllib.parse
from typing import final

from starlette.datastructures import URL, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The cookie's name: this prefix and a hash of the token (`cookie_name`).
COOKIE_PREFIX = "trioexec_dashboard_"
CSRF_FIELD = "csrf"

#: Sent with every response. No inline script anywhere (the one script is a
#: static file); inline SVG needs no exception; nothing may frame the pages.
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # (not no-referrer: with it, browsers send "Origin: null" on a form's POST)
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def new_token() -> str:
    return secrets.token_urlsafe(24)


def cookie_name(token: str) -> str:
    """The token cookie's name, its own per dashboard: a browser scopes cookies by
    host, not port, so two dashboards on one machine would overwrite each other's
    login. (12 hex digits of a SHA-256 of a random token tell nothing of it.)"""
    return COOKIE_PREFIX + hashlib.sha256(token.encode()).hexdigest()[:12]


def csrf_of(token: str) -> str:
    """The CSRF field every form carries: an HMAC of the token, never the token."""
    return hmac.new(token.encode(), b"trioexec dashboard csrf", hashlib.sha256).hexdigest()


def cookie_value(token: str) -> str:
    """What the token's cookie holds: an HMAC of the token under another label than
    `csrf_of`'s (the pages show that one). A browser sends it to every port of the
    host: a server there learns neither the token nor a value another dashboard takes."""
    return hmac.new(token.encode(), b"trioexec dashboard cookie", hashlib.sha256).hexdigest()


def is_local_path(text: str) -> bool:
    """Whether ``text`` is a path of this site, safe as a redirect's target: one
    ``/`` first (``//host/`` is another site's URL), no backslash (a browser reads
    ``/\\host/`` as ``//host/``), no space or control character (a browser drops
    tabs and newlines from a URL, so ``/\\t/host/`` would be ``//host/`` too)."""
    return (
        text.startswith("/")
        and not text.startswith("//")
        and all(c != "\\" and c.isprintable() and not c.isspace() for c in text)
    )


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@final
class Guard:
    """The checks the routes make, for one token."""

    def __init__(self, token: str, *, require_token_for_reads: bool) -> None:
        if not token:
            raise ValueError("the dashboard's token must not be empty")
        self.token = token
        self.csrf = csrf_of(token)
        self.cookie = cookie_name(token)
        self.cookie_value = cookie_value(token)
        self.require_token_for_reads = require_token_for_reads

    def has_token(self, request: Request) -> bool:
        cookie = request.cookies.get(self.cookie, "")
        return hmac.compare_digest(cookie.encode(), self.cookie_value.encode())

    def may_read(self, request: Request) -> bool:
        """Reads are free on loopback, asked for by a loopback name: a page of
        another site whose name was rebound to 127.0.0.1 (DNS rebinding) asks
        with its own name, and needs the token (which it cannot have)."""
        if not self.require_token_for_reads and is_loopback(request.url.hostname or ""):
            return True
        return self.has_token(request)

    def refusal(self, request: Request, form: dict[str, str]) -> str | None:
        """Why this action must not run (None: it may)."""
        if not self.has_token(request):
            return "no valid token: open the URL the dashboard printed (it carries ?token=)"
        if not hmac.compare_digest(form.get(CSRF_FIELD, "").encode(), self.csrf.encode()):
            return "the form's CSRF field is missing or wrong: reload the page and try again"
        if not same_origin(request):
            return "the request came from another site (Origin)"
        return None


def sent_path(request: Request) -> str:
    """The request's path as the client sent it, percent-encoded, for a link or
    redirect back to it (the decoded path would turn ``a%2F..%2Fb`` into
    ``a/../b``, which a browser resolves to another page)."""
    raw = request.scope.get("raw_path")
    if not isinstance(raw, bytes):
        return urllib.parse.quote(request.url.path)
    # (re-encoded where the bytes were not a URL's: a raw space, a byte over 127)
    return urllib.parse.quote_from_bytes(raw.partition(b"?")[0], safe="/%-._~!$&'()*+,;=:@")


def same_origin(request: Request) -> bool:
    """The browser's Origin (or, without one, Sec-Fetch-Site) says this site."""
    origin = request.headers.get("origin")
    if origin is None:
        return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")
    parts = urllib.parse.urlsplit(origin)
    host = request.headers.get("host", "")
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


@final
class Gate:
    """ASGI middleware: security headers on every response; ``?token=`` turns into
    the cookie (and a redirect without it); reads refused without the token when
    the guard wants it (static files excepted: they hold nothing of the store)."""

    def __init__(self, app: ASGIApp, *, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", []))}
                MutableHeaders(raw=message["headers"]).update(HEADERS)
            await send(message)

        request = Request(scope)
        response = self._intercept(request)
        if response is not None:
            await response(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)

    def _intercept(self, request: Request) -> Response | None:
        given = request.query_params.get("token")
        if given is not None and request.method == "GET":
            if not hmac.compare_digest(given.encode(), self.guard.token.encode()):
                return PlainTextResponse("wrong token: open the URL the dashboard printed", 403)
            query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            path = sent_path(request)
            if not is_local_path(path):  # (``//evil.example/?token=``: not there)
                path = "/"
            target = URL(path=path, query=urllib.parse.urlencode(query))
            response = RedirectResponse(str(target), status_code=303)
            response.set_cookie(
                self.guard.cookie,
                self.guard.cookie_value,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path="/",
            )
            return response
        if not request.url.path.startswith("/static/") and not self.guard.may_read(request):
            return PlainTextResponse(
                "this dashboard needs its token: open the URL it printed (with ?token=)", 403
            )
        return None
