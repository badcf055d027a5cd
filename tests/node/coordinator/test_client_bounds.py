"""The node side of the bounds (issue 29): a coordinator answer nested 100,000 deep, a
``javascript:`` URL and a pinned coordinator that is no peer id each end ``cnode train`` with
one line and the exit status of its stop reason, at once (no traceback, no 60 s of retries)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from cnode.auth import Identity
from cnode.node.cli import main
from cnode.node.coordinator import (
    BadRunState,
    RunConfig,
    RunConfigError,
    SyncCoordinatorClient,
    limits,
)
from cnode.node.coordinator._client._client_core import Core
from cnode.node.coordinator._wire._json import JSONTooDeep, json_depth, loads_bounded
from cnode.node.train import StopReason
from tests.support.cli import node_home, run_config_file

DEEP = b"[" * 100_000

CONFIGURATION = StopReason.CONFIGURATION.exit_code
COORDINATOR = StopReason.COORDINATOR.exit_code


class _Deep(BaseHTTPRequestHandler):
    """Answers every request 200 with 100,000 ``[`` (a hostile or broken coordinator URL)."""

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(DEEP)))
        self.end_headers()
        self.wfile.write(DEEP)

    do_GET = _answer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._answer()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def deep_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Deep)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(10)


def _train(tmp_path: Path, config: Path, *extra: str) -> list[str]:
    tmp_path.mkdir(exist_ok=True)
    home = node_home(tmp_path)
    return ["train", "--home", str(home), "--run-config", str(config), "--run", "r1", *extra]


def _one_line(err: str) -> str:
    said = ("cnode: error:", "cnode: stopped (")  # a usage error, or a stop and its reason
    lines = [line for line in err.splitlines() if line.startswith(said)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_depth_check_is_linear_and_ignores_strings() -> None:
    assert json_depth('{"a": [1, {"b": "[[[[{{{{"}]}') == 3
    assert json_depth('"\\"[[["') == 0  # an escaped quote does not end the string
    assert json_depth("5") == 0
    with pytest.raises(JSONTooDeep, match="MAX_JSON_DEPTH"):
        loads_bounded(DEEP)
    deep_ok = "[" * limits.MAX_JSON_DEPTH + "]" * limits.MAX_JSON_DEPTH
    assert loads_bounded(deep_ok) is not None
    with pytest.raises(JSONTooDeep):
        loads_bounded("[" + deep_ok + "]")
    with pytest.raises(ValueError, match="Expecting"):
        loads_bounded("{not json")
    started = time.perf_counter()
    with pytest.raises(JSONTooDeep):
        loads_bounded("[" * 2_000_000)
    with pytest.raises(ValueError):  # an unterminated string of escaped quotes: still linear
        loads_bounded('"' + '\\"' * 1_000_000)
    assert time.perf_counter() - started < 5.0
    assert json_depth('["a]", ["\\"["]]') == 2 and json_depth('["abc') == 1


def test_client_answer_nested_too_deep_is_one_error(deep_url: str) -> None:
    me = Identity.generate()
    with (
        SyncCoordinatorClient(deep_url, run="r1", coordinator=me.peer_id_str, identity=me) as c,
        pytest.raises(BadRunState, match="MAX_JSON_DEPTH"),
    ):
        c.run_state()
    response = httpx.Response(429, content=b'{"error": "busy"}', headers={"Retry-After": "nan"})
    with pytest.raises(Exception) as err:
        Core.answer(response)
    assert getattr(err.value, "retry_after_s", None) == 1.0  # a non-number header: 1 s


def test_train_against_a_deep_answer_is_one_line(
    tmp_path: Path, deep_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = run_config_file(tmp_path)
    started = time.monotonic()
    # The coordinator misbehaved: the "coordinator" reason of the closed set, its exit status.
    assert main(_train(tmp_path, config, "--coordinator", deep_url)) == COORDINATOR
    line = _one_line(capsys.readouterr().err)
    assert "MAX_JSON_DEPTH" in line
    assert time.monotonic() - started < limits.COORDINATOR_OUTAGE_S / 2  # not retried


@pytest.mark.parametrize("url", ["javascript:alert(1)", "file:///etc/passwd", "ftp://x/", "x"])
def test_non_http_url_is_refused_at_once(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    assert main(_train(tmp_path, run_config_file(tmp_path), "--coordinator", url)) == CONFIGURATION
    assert "is not an http(s) URL" in _one_line(capsys.readouterr().err)
    assert time.monotonic() - started < 10.0
    # The same URL in the run config: refused when the file is read, naming the field.
    config = run_config_file(tmp_path, url=url)
    assert main(_train(tmp_path / "again", config)) == CONFIGURATION
    line = _one_line(capsys.readouterr().err)
    assert "url " in line and "is not an http(s) URL" in line


def test_pinned_coordinator_must_be_a_peer_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = run_config_file(tmp_path, coordinator="not-a-peer-id")
    assert main(_train(tmp_path, config)) == CONFIGURATION
    assert "coordinator:" in _one_line(capsys.readouterr().err)
    for bad in ("12D3KooW", "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "x" * 200):
        with pytest.raises(RunConfigError, match=r"^coordinator: "):
            RunConfig.from_dict({"run": "r1", "coordinator": bad})
