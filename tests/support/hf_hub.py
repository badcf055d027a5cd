"""A small Hugging Face Hub look-alike for tests: a real HTTP server on 127.0.0.1.

The real ``huggingface_hub`` client talks to it through ``HF_ENDPOINT`` (or ``HfApi(endpoint=)``),
so tests exercise the client's real requests and error handling. Only what cnode uses is here:

* ``GET /api/whoami-v2``: users, their orgs, access tokens, revocation
  (:meth:`FakeHub.add_user`, :meth:`FakeHub.revoke`).

Adding endpoints (model repos: create, commit/upload, resolve/download): write a handler
``def handle(hub: FakeHub, req: Request) -> Response`` and register it with
``hub.route("POST", r"/api/repos/create", handle)`` (or add it to ``_DEFAULT_ROUTES``). Routes are
regular expressions matched against the path (without the query); named groups land in
``req.params``. ``req.user`` is the authenticated user (or None) and ``hub.require_user(req)``
answers 401 the way the Hub does. Keep repo state on the ``FakeHub`` (e.g. a ``repos`` dict) and
guard it with ``hub.lock``: handlers run in server threads.

Usage::

    with FakeHub() as hub:
        token = hub.add_user("alice", orgs=["acme"])
        HfApi(endpoint=hub.url).whoami(token=token)

The server never logs tokens; ``hub.requests`` records (method, path, user) of every request.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

# Largest request body the server reads (uploads will need more: raise it per route then).
MAX_BODY = 16 * 1024 * 1024


@dataclass
class User:
    name: str
    fullname: str
    orgs: list[str] = field(default_factory=list)


@dataclass
class Token:
    value: str
    user: str
    role: str = "write"  # "read" | "write" | "fineGrained"
    revoked: bool = False


@dataclass
class Request:
    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    params: dict[str, str]  # named groups of the route's pattern
    user: User | None  # from "Authorization: Bearer <token>", if valid
    token: Token | None


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, value: Any, status: int = 200, **headers: str) -> Response:
        body = json.dumps(value).encode()
        return cls(status, body, {"Content-Type": "application/json", **headers})

    @classmethod
    def error(cls, status: int, message: str) -> Response:
        """An error the way the Hub sends it: JSON body plus X-Error-Message."""
        return cls.json({"error": message}, status, **{"X-Error-Message": message})


Handler = Callable[["FakeHub", Request], Response]


class HubRefusal(Exception):
    """Raised inside a handler to answer with ``response`` (e.g. by require_user)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


def whoami(hub: FakeHub, req: Request) -> Response:
    user = hub.require_user(req)
    assert req.token is not None
    return Response.json(
        {
            "type": "user",
            "id": f"id-{user.name}",
            "name": user.name,
            "fullname": user.fullname,
            "email": f"{user.name}@example.invalid",
            "emailVerified": True,
            "isPro": False,
            "orgs": [
                {"type": "org", "name": org, "fullname": org.title(), "roleInOrg": "write"}
                for org in user.orgs
            ],
            "auth": {
                "type": "access_token",
                "accessToken": {"displayName": "test", "role": req.token.role},
            },
        }
    )


_DEFAULT_ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", r"/api/whoami-v2", whoami),
]


class FakeHub:
    """The server and its state. Thread-safe; start with ``with`` or :meth:`start`/:meth:`stop`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users: dict[str, User] = {}
        self.tokens: dict[str, Token] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        # (method, path regex) -> status: answer every matching request with this error.
        self.failures: dict[tuple[str, str], int] = {}
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        for method, pattern, handler in _DEFAULT_ROUTES:
            self.route(method, pattern, handler)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- state -------------------------------------------------------------------------------
    def add_user(
        self, name: str, *, orgs: list[str] | None = None, token: str | None = None
    ) -> str:
        """Create user ``name`` (if new) and return a fresh access token for it."""
        value = token or "hf_" + secrets.token_urlsafe(26).replace("-", "a").replace("_", "b")
        with self.lock:
            self.users.setdefault(name, User(name, name.title(), list(orgs or [])))
            self.tokens[value] = Token(value, name)
        return value

    def revoke(self, token: str) -> None:
        with self.lock:
            self.tokens[token].revoked = True

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        """Serve ``method`` requests whose path fully matches ``pattern`` with ``handler``."""
        self._routes.append((method, re.compile(pattern), handler))

    def require_user(self, req: Request) -> User:
        if req.user is None:
            raise HubRefusal(Response.error(401, "Invalid credentials in Authorization header"))
        return req.user

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeHub is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeHub:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- dispatch ----------------------------------------------------------------------------
    def _authenticate(self, headers: dict[str, str]) -> tuple[User | None, Token | None]:
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return None, None
        with self.lock:
            token = self.tokens.get(auth[len("Bearer ") :])
            if token is None or token.revoked:
                return None, None
            return self.users[token.user], token

    def dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Response:
        parts = urlsplit(target)
        path = parts.path
        user, token = self._authenticate(headers)
        with self.lock:
            self.requests.append((method, path, user.name if user else None))
            for (fail_method, fail_pattern), status in self.failures.items():
                if fail_method == method and re.fullmatch(fail_pattern, path):
                    return Response.error(status, f"injected failure {status}")
        if headers.get("authorization", "").startswith("Bearer ") and user is None:
            # The Hub refuses any request that carries a bad or revoked token, even public ones.
            return Response.error(401, "Invalid credentials in Authorization header")
        for route_method, pattern, handler in self._routes:
            match = pattern.fullmatch(path)
            if match and route_method == method:
                req = Request(
                    method, path, parts.query, headers, body, match.groupdict(), user, token
                )
                try:
                    return handler(self, req)
                except HubRefusal as refusal:
                    return refusal.response
        return Response.error(404, f"no route for {method} {path}")


def _make_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            length = int(headers.get("content-length", "0") or 0)
            if length > MAX_BODY:
                self._send(Response.error(413, "request body too large"))
                return
            body = self.rfile.read(length) if length else b""
            self._send(hub.dispatch(self.command, self.path, headers, body))

        def _send(self, response: Response) -> None:
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: and request lines could carry secrets in query strings

    return _Handler
