"""The dashboard's HTTP server (standard library ``http.server``, one thread per request).

Safety on a shared machine:

* it listens on 127.0.0.1 unless told otherwise;
* requests whose ``Host`` header is not the address served are refused, so a web
  page elsewhere cannot reach it through DNS rebinding;
* reading is open to whoever can connect; destructive actions (purge) need the
  access token printed at start, sent in the form (POST only) or, for scripts, in an
  ``X-Fsbus-Token`` header. Opening ``/?token=...`` stores it in a same-site cookie so
  confirmation forms can carry it. Every response forbids framing.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import secrets
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from fsbus import BlockingBus, BusConfig, FsBusError, UsageError

from . import _html
from ._snapshot import MAX_TOPIC_ROWS, Dashboard, PayloadTooLargeToShow

__all__ = ["UiServer"]

log = logging.getLogger("fsbus.ui")

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_MAX_FORM = 64 * 1024
_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)


class UiServer:
    """Serve the dashboard of the bus at ``root``.

    Use as a context manager: ``start()`` serves from a background thread,
    ``serve_forever()`` from the calling one; leaving the block stops the server
    and closes the bus.
    """

    def __init__(
        self,
        root: str,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        token: str | None = None,
        config: BusConfig | None = None,
    ) -> None:
        self.token = token or secrets.token_urlsafe(18)
        self.bus = BlockingBus(root, config=config)
        self.dashboard = Dashboard(self.bus)
        handler = type("_BoundHandler", (_Handler,), {"ui": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host = host
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the dashboard is served."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        if self.host in ("0.0.0.0", "::", ""):
            shown = "127.0.0.1"
        return f"http://{shown}:{self.port}/"

    @property
    def login_url(self) -> str:
        """The URL that also hands the access token to the browser."""
        return f"{self.url}?token={self.token}"

    @property
    def cookie_name(self) -> str:
        return f"fsbus_ui_{self.port}"

    def allowed_host(self, header: str | None) -> bool:
        """Whether a request's Host header names this server (DNS rebinding guard)."""
        if self.host in ("0.0.0.0", "::", ""):
            return True  # listening everywhere on purpose: any name may reach it
        if not header:
            return False
        names = {*_LOOPBACK_NAMES, self.host, f"[{self.host}]"}
        return header.lower() in {f"{n}:{self.port}" for n in names} | names

    def token_ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(
            candidate.encode("utf-8", "replace"), self.token.encode()
        )

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Self:
        self.bus.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Serve from a background thread (stopped by :meth:`close`)."""
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.1,), name="fsbus-ui", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        """Serve from the calling thread until :meth:`close` is called from another one."""
        self.httpd.serve_forever(0.1)

    def close(self) -> None:
        """Stop serving and close the bus."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()
        self.bus.close()


class _Handler(BaseHTTPRequestHandler):
    ui: UiServer
    server_version = "fsbus-ui"
    protocol_version = "HTTP/1.1"

    # ------------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", _CSP)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _html(self, text: str, status: HTTPStatus = HTTPStatus.OK, **headers: str) -> None:
        self._send(status, text.encode("utf-8"), "text/html; charset=utf-8", headers)

    def _json(self, data: object, status: HTTPStatus = HTTPStatus.OK) -> None:
        body = json.dumps(data, default=_jsonable, indent=1).encode("utf-8")
        self._send(status, body, "application/json")

    def _error(self, status: HTTPStatus, title: str, message: str) -> None:
        if self.path.startswith("/api/"):
            self._json({"error": title, "detail": message}, status)
        else:
            self._html(_html.error_page(self.ui.dashboard.root, title, message), status)

    def _cookie_token(self) -> str | None:
        raw = self.headers.get("Cookie")
        if not raw:
            return None
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except Exception:  # a malformed cookie header is just no token
            return None
        morsel = jar.get(self.ui.cookie_name)
        return morsel.value if morsel is not None else None

    def _guard(self) -> bool:
        if not self.ui.allowed_host(self.headers.get("Host")):
            self._error(
                HTTPStatus.MISDIRECTED_REQUEST,
                "Unknown host",
                f"This dashboard answers only as {self.ui.url}; open it there.",
            )
            return False
        return True

    # ------------------------------------------------------------------ verbs
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._guard():
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            self._get(url.path, query)
        except UsageError as exc:
            self._error(HTTPStatus.BAD_REQUEST, "Bad request", str(exc))
        except FsBusError as exc:
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "The bus failed", str(exc))

    def do_POST(self) -> None:
        if not self._guard():
            return
        origin = self.headers.get("Origin")
        if origin and origin != "null" and not self.ui.allowed_host(urlsplit(origin).netloc):
            self._error(HTTPStatus.FORBIDDEN, "Forbidden", "cross-site request refused")
            return
        url = urlsplit(self.path)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_FORM:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "Bad request", "form too large")
            return
        raw = self.rfile.read(length).decode("utf-8", "replace")
        if url.path == "/api/purge":
            try:
                fields = json.loads(raw or "{}")
            except ValueError:
                fields = None
            if not isinstance(fields, dict):
                self._error(HTTPStatus.BAD_REQUEST, "Bad request", 'send {"pattern": "..."}')
                return
            token = self.headers.get("X-Fsbus-Token")
        else:
            fields = {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}
            token = fields.get("token")
        try:
            if url.path in ("/purge", "/api/purge"):
                self._purge(fields, token, api=url.path.startswith("/api/"))
            else:
                self._error(HTTPStatus.NOT_FOUND, "Not found", f"nothing to post to {url.path}")
        except UsageError as exc:
            self._error(HTTPStatus.BAD_REQUEST, "Bad request", str(exc))
        except FsBusError as exc:
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "The bus failed", str(exc))

    # ------------------------------------------------------------------ pages
    def _get(self, path: str, query: dict[str, str]) -> None:
        dash = self.ui.dashboard
        if path == "/":
            if "token" in query:
                self._login(query["token"])
                return
            self._html(_html.overview_page(dash.snapshot()))
        elif path == "/api/overview":
            self._json(dash.snapshot())
        elif path == "/topic":
            topic = query.get("t", "")
            infos = dash.messages(topic)
            total = len(infos)
            infos = infos[:MAX_TOPIC_ROWS]
            owners = {r.info.path: r.owner for r in dash.locked_rows(i for i in infos if i.locked)}
            self._html(_html.topic_page(dash.root, topic, infos, owners, total=total))
        elif path == "/message":
            info = dash.find(query.get("bucket", ""), query.get("name", ""))
            if info is None:
                self._error(
                    HTTPStatus.NOT_FOUND,
                    "Message not found",
                    "It was consumed or has expired (or the link is wrong).",
                )
                return
            owner = None
            if info.locked:
                owner = dash.locked_rows([info])[0].owner
            try:
                payload: bytes | str | None = dash.payload(info)
            except PayloadTooLargeToShow as exc:
                payload = str(exc)
            self._html(_html.message_page(dash.root, info, payload, owner))
        elif path == "/purge":
            preview = dash.purge_preview(query.get("pattern", ""))
            token = self._cookie_token()
            shown = token if self.ui.token_ok(token) else None
            self._html(_html.purge_confirm_page(dash.root, preview, shown))
        elif path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        else:
            self._error(HTTPStatus.NOT_FOUND, "Not found", f"there is no page {path}")

    def _login(self, token: str) -> None:
        if not self.ui.token_ok(token):
            self._error(
                HTTPStatus.FORBIDDEN,
                "Wrong token",
                "That is not the access token `fsbus ui` printed when it started.",
            )
            return
        cookie = f"{self.ui.cookie_name}={token}; Path=/; HttpOnly; SameSite=Strict"
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie})

    def _purge(self, fields: dict[str, Any], token: str | None, *, api: bool) -> None:
        if not self.ui.token_ok(token):
            self._error(
                HTTPStatus.FORBIDDEN,
                "Access token needed",
                "Purging needs the access token `fsbus ui` printed when it started.",
            )
            return
        pattern = fields.get("pattern")
        if not isinstance(pattern, str):
            self._error(HTTPStatus.BAD_REQUEST, "Bad request", "say which pattern to purge")
            return
        if not api and fields.get("confirm") != pattern:
            self._error(
                HTTPStatus.BAD_REQUEST,
                "Not confirmed",
                f"Type the pattern {pattern!r} exactly to confirm the purge; nothing was deleted.",
            )
            return
        result = self.ui.dashboard.purge(pattern)
        log.info(
            "purged %d work-queue message(s) matching %r (%d locked, left alone)",
            result.purged,
            pattern,
            result.locked,
        )
        if api:
            self._json(result)
        else:
            self._html(_html.purge_done_page(self.ui.dashboard.root, result))


def _jsonable(obj: object) -> object:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        for name in ("messages", "singles", "size", "records"):
            value = getattr(type(obj), name, None)
            if isinstance(value, property):
                out[name] = getattr(obj, name)
        return out
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")
