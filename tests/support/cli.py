"""What the CLI tests set up before they run ``cnode``: a node home with its key, and a run config
file (the pieces ``cnode train`` reads first)."""

from __future__ import annotations

from pathlib import Path

import tomli_w

from cnode.auth import Identity, save_identity
from cnode.node._config import IDENTITY_FILE


def node_home(tmp_path: Path) -> Path:
    """``tmp_path/home`` with a new identity key in it (what ``cnode init`` leaves)."""
    home = tmp_path / "home"
    home.mkdir()
    save_identity(Identity.generate(), home / IDENTITY_FILE)
    return home


def run_config_file(tmp_path: Path, **extra: object) -> Path:
    """``tmp_path/run.toml`` for run ``r1`` pinning a new coordinator key, plus ``extra`` keys."""
    path = tmp_path / "run.toml"
    raw = {"run": "r1", "coordinator": Identity.generate().peer_id_str, **extra}
    path.write_text(tomli_w.dumps(raw), encoding="utf-8")
    return path
