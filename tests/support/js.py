"""The JS reference IPFS tools (tests/js: @ipld/car + ipfs-unixfs-exporter, @helia/verified-fetch).

``make test`` installs them (``npm ci`` in tests/js, from the committed package-lock.json). A
missing node or install is an error with the command that fixes it, never a skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

JS_DIR = Path(__file__).resolve().parents[1] / "js"
# Bounded: the unpack of a test checkpoint takes well under a second.
NODE_TIMEOUT_S = 120


def unpack_car(car: Path, root: str, out: Path) -> dict[str, Any]:
    """Unpack the UnixFS directory ``root`` from ``car`` into ``out`` with the JS reference."""
    node = shutil.which("node")
    assert node, "node is not installed (the JS interop tests need Node.js >= 20)"
    assert (JS_DIR / "node_modules" / "ipfs-unixfs-exporter").is_dir(), (
        f"JS reference tools are not installed: run `make test` or `cd {JS_DIR} && npm ci`"
    )
    done = subprocess.run(
        [node, str(JS_DIR / "unpack.mjs"), str(car), root, str(out)],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        cwd=JS_DIR,
    )
    assert done.returncode == 0, f"JS unpack failed: {done.stderr[-2000:]}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def verified_fetch(
    gateway: str, cid: str, path: str, out: Path, accept: str | None = None
) -> dict[str, Any]:
    """Fetch ``ipfs://cid/path`` through ``gateway`` with @helia/verified-fetch into ``out``."""
    node = shutil.which("node")
    assert node, "node is not installed (the JS interop tests need Node.js >= 20)"
    assert (JS_DIR / "node_modules" / "@helia" / "verified-fetch").is_dir(), (
        f"JS reference tools are not installed: run `make test` or `cd {JS_DIR} && npm ci`"
    )
    args = [node, str(JS_DIR / "verified_fetch.mjs"), gateway, cid, path, str(out)]
    done = subprocess.run(
        [*args, *([accept] if accept else [])],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        cwd=JS_DIR,
    )
    assert done.returncode == 0, f"verified-fetch failed: {done.stderr[-2000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
