"""A small Hugging Face Hub look-alike for tests: a real HTTP server on 127.0.0.1.

The real ``huggingface_hub`` client talks to it through ``HF_ENDPOINT`` (or ``HfApi(endpoint=)``),
so tests exercise the client's real requests and error handling. Only what cnode uses is here:

* ``GET /api/whoami-v2``: users, their orgs, access tokens, revocation
  (:meth:`FakeHub.add_user`, :meth:`FakeHub.revoke`).
* Model and dataset repos, as ``HfApi.create_repo``, ``upload_file`` / ``upload_folder`` /
  ``create_commit``, ``hf_hub_download`` and ``transformers``' ``from_pretrained`` use them:
  ``POST /api/repos/create`` (``"type": "dataset"`` for a dataset), ``POST
  /api/{kind}/{repo}/preupload/{rev}`` (every file "regular": its bytes travel base64 inside the
  commit, a mode the real Hub uses for small files), ``POST /api/{kind}/{repo}/commit/{rev}``
  (NDJSON), ``GET /api/{kind}/{repo}`` and ``GET /api/{kind}/{repo}/revision/{rev}`` (repo info;
  the first is the main branch), ``GET /api/{kind}/{repo}/tree/{rev}[/{path}]`` (``list_repo_tree``:
  sizes and git blob ids), and ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` (models) or
  ``/datasets/{repo}/resolve/{rev}/{path}``, where ``{kind}`` is ``models`` or ``datasets``. Model
  repos live in ``hub.repos``, dataset repos in ``hub.datasets`` (the Hub keeps the two apart: a
  model and a dataset may share a name). Writes need a write token of the namespace's user or of
  a member of its org; repos are public to read. :meth:`FakeHub.tamper` changes a stored file in
  place (a Hub that serves wrong bytes).

Adding endpoints: write a handler
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

import base64
import hashlib
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

# Largest request body the server reads (a commit carries its files base64-encoded).
MAX_BODY = 64 * 1024 * 1024


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
class Repo:
    """A model or dataset repo: commits oldest first, each the whole tree of files after it."""

    repo_id: str
    kind: str = "models"  # "models" | "datasets", as in the API's paths
    commits: list[tuple[str, dict[str, bytes]]] = field(default_factory=list)
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit sha

    def tree(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        """(commit sha, files) of a branch name or a full commit sha, else None."""
        sha = self.branches.get(revision, revision)
        for commit, files in self.commits:
            if commit == sha:
                return commit, files
        return None


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


_REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
_REV = r"(?P<rev>[^/]+)"
_KIND = r"(?P<kind>models|datasets)"
# The Hub's word for each kind: in create_repo's "type", and in its messages.
_TYPE_OF_KIND = {"models": "model", "datasets": "dataset"}


def _repo(hub: FakeHub, req: Request) -> Repo:
    repo = hub.repos_of(req.params.get("kind") or "models").get(req.params["repo"])
    if repo is None:
        raise HubRefusal(Response.error(404, "Repository not found"))
    return repo


def _tree(hub: FakeHub, req: Request) -> tuple[Repo, str, dict[str, bytes]]:
    repo = _repo(hub, req)
    found = repo.tree(req.params["rev"])
    if found is None:
        raise HubRefusal(Response.error(404, f"Invalid rev id: {req.params['rev']}"))
    return repo, *found


def _require_writer(hub: FakeHub, req: Request, namespace: str) -> User:
    user = hub.require_user(req)
    assert req.token is not None
    if req.token.role == "read" or (namespace != user.name and namespace not in user.orgs):
        raise HubRefusal(Response.error(403, f"You don't have the rights to write to {namespace}"))
    return user


def create_repo(hub: FakeHub, req: Request) -> Response:
    user = hub.require_user(req)
    body = json.loads(req.body or b"{}")
    namespace = body.get("organization") or user.name
    repo_id = f"{namespace}/{body.get('name')}"
    kind = {"model": "models", "dataset": "datasets"}.get(body.get("type") or "model")
    if kind is None:
        return Response.error(400, f"the fake Hub has no {body.get('type')!r} repos")
    _require_writer(hub, req, namespace)
    if not re.fullmatch(_REPO, repo_id):
        return Response.error(400, f"bad repo id {repo_id!r}")
    repos = hub.repos_of(kind)
    # The client reads the url to learn the repo's type: datasets' urls have "/datasets/".
    url = f"{hub.url}/{repo_id}" if kind == "models" else f"{hub.url}/{kind}/{repo_id}"
    if repo_id in repos:
        # The Hub's conflict answer names the repo's url too (the client reads it on exist_ok).
        message = f"You already created this {_TYPE_OF_KIND[kind]} repo"
        return Response.json({"error": message, "url": url}, 409, **{"X-Error-Message": message})
    repo = Repo(repo_id, kind)
    sha = hub.new_sha()
    repo.commits.append((sha, {".gitattributes": b""}))
    repo.branches["main"] = sha
    repos[repo_id] = repo
    return Response.json({"url": url, "name": repo_id, "id": hub.new_sha()})


def preupload(hub: FakeHub, req: Request) -> Response:
    repo = _repo(hub, req)
    _require_writer(hub, req, repo.repo_id.split("/")[0])
    files = json.loads(req.body)["files"]
    modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
    return Response.json({"files": modes})


def commit(hub: FakeHub, req: Request) -> Response:
    repo = _repo(hub, req)
    _require_writer(hub, req, repo.repo_id.split("/")[0])
    branch = req.params["rev"]
    if branch not in repo.branches:
        return Response.error(404, f"Invalid rev id: {branch}")
    files = dict(repo.tree(branch)[1])  # type: ignore[index]
    for line in req.body.splitlines():
        item = json.loads(line)
        value = item["value"]
        if item["key"] == "file":
            files[value["path"]] = base64.b64decode(value["content"])
        elif item["key"] == "deletedFile":
            files.pop(value["path"], None)
        elif item["key"] != "header":
            return Response.error(400, f"the fake Hub does not take {item['key']!r} operations")
    sha = hub.new_sha()
    repo.commits.append((sha, files))
    repo.branches[branch] = sha
    prefix = "" if repo.kind == "models" else f"/{repo.kind}"
    return Response.json(
        {
            "success": True,
            "commitOid": sha,
            "commitUrl": f"{hub.url}{prefix}/{repo.repo_id}/commit/{sha}",
            "pullRequestUrl": None,
        }
    )


def revision_info(hub: FakeHub, req: Request) -> Response:
    """``HfApi.repo_info``: ``/api/{kind}/{repo}/revision/{rev}``, or without it for main."""
    req.params.setdefault("rev", "main")
    repo, sha, files = _tree(hub, req)
    info: dict[str, Any] = {"id": repo.repo_id, "author": repo.repo_id.split("/")[0]}
    if repo.kind == "models":
        info["modelId"] = repo.repo_id  # the Hub sends this legacy key for models only
    info.update(
        {
            "sha": sha,
            "private": False,
            "siblings": [{"rfilename": name} for name in sorted(files)],
        }
    )
    return Response.json(info)


def git_blob_id(data: bytes) -> str:
    """A file's git blob id, as the Hub's tree listing gives a (non-LFS) file's ``oid``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree(hub: FakeHub, req: Request) -> Response:
    """``HfApi.list_repo_tree``: the files (path, size, git blob id) and folders of a commit
    under ``path``, in one page; ``recursive=true`` for the whole subtree."""
    _, _, files = _tree(hub, req)
    base = (req.params.get("path") or "").strip("/")
    recursive = "recursive=true" in req.query.lower() or "recursive=1" in req.query
    entries: dict[str, dict[str, Any]] = {}
    for name, data in sorted(files.items()):
        if base and not name.startswith(base + "/"):
            continue
        rest = name[len(base) + 1 :] if base else name
        parts = rest.split("/")
        depth = len(parts) if recursive else 1
        for i in range(1, min(depth, len(parts) - 1) + 1):
            folder = "/".join(filter(None, [base, *parts[:i]]))
            entries[folder] = {"type": "directory", "oid": "0" * 40, "path": folder}
        if recursive or len(parts) == 1:
            size = hub.listed_sizes.get(name, len(data))
            entries[name] = {"type": "file", "oid": git_blob_id(data), "size": size, "path": name}
    return Response.json(list(entries.values()))


def resolve(hub: FakeHub, req: Request) -> Response:
    _, sha, files = _tree(hub, req)
    data = files.get(req.params["path"])
    if data is None:
        return Response.error(404, "Entry not found")
    etag = hashlib.sha256(data).hexdigest()
    return Response(200, data, {"X-Repo-Commit": sha, "ETag": f'"{etag}"'})


def _locked(handler: Handler) -> Handler:
    """Run ``handler`` holding ``hub.lock`` (repo state is shared by the server threads)."""

    def run(hub: FakeHub, req: Request) -> Response:
        with hub.lock:
            return handler(hub, req)

    return run


_DEFAULT_ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", r"/api/whoami-v2", whoami),
    ("POST", r"/api/repos/create", _locked(create_repo)),
    ("POST", rf"/api/{_KIND}/{_REPO}/preupload/{_REV}", _locked(preupload)),
    ("POST", rf"/api/{_KIND}/{_REPO}/commit/{_REV}", _locked(commit)),
    ("GET", rf"/api/{_KIND}/{_REPO}", _locked(revision_info)),
    ("GET", rf"/api/{_KIND}/{_REPO}/revision/{_REV}", _locked(revision_info)),
    ("GET", rf"/api/{_KIND}/{_REPO}/tree/{_REV}(?:/(?P<path>.*))?", _locked(tree)),
    ("GET", rf"/(?P<kind>datasets)/{_REPO}/resolve/{_REV}/(?P<path>.+)", _locked(resolve)),
    ("HEAD", rf"/(?P<kind>datasets)/{_REPO}/resolve/{_REV}/(?P<path>.+)", _locked(resolve)),
    ("GET", rf"/{_REPO}/resolve/{_REV}/(?P<path>.+)", _locked(resolve)),
    ("HEAD", rf"/{_REPO}/resolve/{_REV}/(?P<path>.+)", _locked(resolve)),
]


class FakeHub:
    """The server and its state. Thread-safe; start with ``with`` or :meth:`start`/:meth:`stop`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users: dict[str, User] = {}
        self.tokens: dict[str, Token] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.repos: dict[str, Repo] = {}  # model repos
        self.datasets: dict[str, Repo] = {}  # dataset repos
        # path -> size the tree listing says instead of the file's (a Hub that lies about it).
        self.listed_sizes: dict[str, int] = {}
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

    def new_sha(self) -> str:
        return secrets.token_hex(20)

    def repos_of(self, kind: str) -> dict[str, Repo]:
        """The repos of ``kind`` ("models" or "datasets"), by id."""
        return self.datasets if kind == "datasets" else self.repos

    def file(
        self, repo_id: str, path: str, revision: str = "main", *, kind: str = "models"
    ) -> bytes:
        """A file as the Hub holds it (KeyError if absent)."""
        with self.lock:
            found = self.repos_of(kind)[repo_id].tree(revision)
            assert found is not None, revision
            return found[1][path]

    def tamper(
        self, repo_id: str, path: str, data: bytes, revision: str = "main", *, kind: str = "models"
    ) -> None:
        """Replace a stored file's bytes, keeping its commit (a Hub that serves wrong bytes)."""
        with self.lock:
            found = self.repos_of(kind)[repo_id].tree(revision)
            assert found is not None, revision
            found[1][path] = data

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
