"""`cnode init`: home folder, key, config, --force, --hf-login against the local FakeHub.

Run in-process through ``cnode.node.cli.main`` (each subprocess costs seconds of imports here);
tests/node/test_logging.py runs the real console script for what needs a separate process.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from cnode.auth import load_identity, verify_hf_binding
from cnode.node._config import load_config
from cnode.node.cli import main
from tests.support.fixtures import dead_endpoint, hf_hub  # noqa: F401
from tests.support.hf_hub import FakeHub


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("CNODE_HOME", raising=False)
    yield
    structlog.contextvars.clear_contextvars()  # init binds the peer id


def _init(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["init", "--home", str(home), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> bool:
    """Exactly one `cnode: error:` line (log lines may precede it) and no traceback."""
    errors = [line for line in err.splitlines() if line.startswith("cnode: error: ")]
    return len(errors) == 1 and "Traceback" not in err


def _snapshot(home: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
        for p in sorted(home.iterdir())
        if p.is_file()
    }


def test_fresh_init(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    rc, out, _ = _init(capsys, home)
    assert rc == 0
    identity = load_identity(home / "identity.key")
    assert f"peer id: {identity.peer_id_str}" in out
    assert "Created a new key" in out
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "identity.key").stat().st_mode) == 0o600
    config = load_config(home)
    assert config.hf_username == ""
    assert sorted(p.name for p in home.iterdir()) == ["config.toml", "identity.key"]


def test_default_home_from_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CNODE_HOME", str(tmp_path / "envhome"))
    assert main(["init"]) == 0
    assert (tmp_path / "envhome" / "identity.key").exists()


def test_second_run_keeps_key_and_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    _init(capsys, home)
    before = _snapshot(home)
    rc, out, _ = _init(capsys, home)
    assert rc == 0
    assert "Kept the existing key" in out and "Kept the existing" in out
    assert _snapshot(home) == before


def test_force_replaces_key_and_keeps_backup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    _init(capsys, home)
    old = load_identity(home / "identity.key")
    old_bytes = (home / "identity.key").read_bytes()
    rc, out, _ = _init(capsys, home, "--force")
    assert rc == 0
    new = load_identity(home / "identity.key")
    assert new.peer_id_str != old.peer_id_str
    assert f"peer id: {new.peer_id_str}" in out
    backups = list(home.glob("identity.key.bak-*"))
    assert len(backups) == 1
    assert backups[0].read_bytes() == old_bytes
    assert stat.S_IMODE(backups[0].stat().st_mode) == 0o600
    assert load_identity(backups[0]).peer_id_str == old.peer_id_str
    assert str(backups[0]) in out
    _init(capsys, home, "--force")  # a second backup in the same second gets its own name
    assert len(list(home.glob("identity.key.bak-*"))) == 2


def test_too_open_key_refused_until_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    _init(capsys, home)
    os.chmod(home / "identity.key", 0o644)
    before = _snapshot(home)
    rc, _, err = _init(capsys, home)
    assert rc == 1
    assert _one_error_line(err)
    assert "identity.key has mode 0644" in err and "must be 0600" in err
    assert "cnode init --force" in err
    assert _snapshot(home) == before
    assert _init(capsys, home, "--force")[0] == 0
    assert len(list(home.glob("identity.key.bak-*"))) == 1


def test_truncated_key_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    _init(capsys, home)
    key = home / "identity.key"
    key.write_bytes(key.read_bytes()[:20])
    before = _snapshot(home)
    rc, _, err = _init(capsys, home)
    assert rc == 1 and "truncated: 20 bytes" in err
    assert _snapshot(home) == before


def test_broken_config_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("listen = 5\n")
    rc, _, err = _init(capsys, home)
    assert rc == 1
    assert "config.toml: listen must be a string" in err
    assert sorted(p.name for p in home.iterdir()) == ["config.toml"]  # no key was made


def test_home_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "file"
    home.write_text("x")
    rc, _, err = _init(capsys, home)
    assert rc == 1 and "exists and is not a folder" in err


# -- --hf-login ---------------------------------------------------------------------------------


def _check_logged_in(home: Path, token: str, username: str, out: str) -> None:
    identity = load_identity(home / "identity.key")
    token_file = home / "hf_token"
    assert token_file.read_text() == token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    binding = verify_hf_binding(
        (home / "hf_binding.cbor").read_bytes(), expected_peer=identity.peer_id_str
    )
    assert binding.username == username
    assert load_config(home).hf_username == username
    assert f"Logged in to Hugging Face as {username}" in out
    assert token not in out


def test_hf_login_with_token_flag(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    token = hf_hub.add_user("alice", orgs=["acme"])
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    home = tmp_path / "home"
    rc, out, err = _init(capsys, home, "--hf-login", "--token", token)
    assert rc == 0, err
    _check_logged_in(home, token, "alice", out)
    assert "orgs: acme" in out
    assert token not in err


def test_hf_login_with_env_token_keeps_existing_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    home = tmp_path / "home"
    _init(capsys, home)
    peer = load_identity(home / "identity.key").peer_id_str
    token = hf_hub.add_user("bob")
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    monkeypatch.setenv("HF_TOKEN", token)
    rc, out, err = _init(capsys, home, "--hf-login")
    assert rc == 0, err
    _check_logged_in(home, token, "bob", out)
    assert load_identity(home / "identity.key").peer_id_str == peer


def test_hf_login_prompts_without_echo(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    # The real no-echo prompt on a terminal is tested through a pty in test_logging.py.
    token = hf_hub.add_user("carol")
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return token

    monkeypatch.setattr("getpass.getpass", fake_getpass)
    rc, out, _ = _init(capsys, tmp_path / "home", "--hf-login")
    assert rc == 0
    assert prompts == ["Hugging Face token (input hidden): "]
    _check_logged_in(tmp_path / "home", token, "carol", out)


def test_hf_login_without_token_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    rc, _, err = _init(capsys, tmp_path / "home", "--hf-login")
    assert rc == 1
    assert "no HF token: pass --token, set HF_TOKEN, or run in a terminal" in err
    assert not (tmp_path / "home").exists()


def _failed_login_leaves_home_alone(
    capsys: pytest.CaptureFixture[str], home: Path, token: str, expect: str, *extra: str
) -> None:
    _init(capsys, home)
    before = _snapshot(home)
    rc, out, err = _init(capsys, home, "--hf-login", "--token", token, *extra)
    assert rc == 1
    assert expect in err
    assert _one_error_line(err)
    assert token not in out + err
    assert _snapshot(home) == before  # key, config untouched; no token, no binding, no backup


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_bad_token(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hf_hub: FakeHub,  # noqa: F811
    force: list[str],
) -> None:
    hf_hub.add_user("alice")
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    bad = "hf_NotAKnownToken0123456789abcdef"
    _failed_login_leaves_home_alone(
        capsys, tmp_path / "home", bad, "rejected the token (HTTP 401)", *force
    )


def test_revoked_token(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    token = hf_hub.add_user("alice")
    hf_hub.revoke(token)
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    _failed_login_leaves_home_alone(capsys, tmp_path / "home", token, "invalid, expired or revoked")


def test_unreachable_endpoint(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dead_endpoint: str,  # noqa: F811
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", dead_endpoint)
    _failed_login_leaves_home_alone(
        capsys,
        tmp_path / "home",
        "hf_SomeTokenThatMustNotLeak0123456",
        f"cannot reach the Hugging Face Hub at {dead_endpoint}",
    )


def test_force_with_hf_login_binds_the_new_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hf_hub: FakeHub,  # noqa: F811
) -> None:
    home = tmp_path / "home"
    _init(capsys, home)
    old = load_identity(home / "identity.key").peer_id_str
    token = hf_hub.add_user("dave")
    monkeypatch.setenv("HF_ENDPOINT", hf_hub.url)
    rc, out, err = _init(capsys, home, "--force", "--hf-login", "--token", token)
    assert rc == 0, err
    _check_logged_in(home, token, "dave", out)  # binding verified against the new key
    assert load_identity(home / "identity.key").peer_id_str != old
    assert len(list(home.glob("identity.key.bak-*"))) == 1
