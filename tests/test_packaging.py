"""``pip install .`` (non-editable) must ship every file the code needs, not only ``*.py``.

An editable install reads the source folders, so only a real wheel shows what a user gets. This
builds one offline, with the venv's own setuptools, from a copy of the tracked files (the build
never writes ``build/`` or ``*.egg-info`` into the checkout), and compares its contents with the
package folders.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> its name inside the wheel (pyproject.toml's package-dir).
PACKAGE_DIRS = {
    "cnode": "cnode",
    "node": "cnode/node",
    "storage": "cnode/storage",
    "aggregation": "cnode/aggregation",
    "auth": "cnode/auth",
}
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "LICENSE")


def _tracked_package_files() -> list[str]:
    """Files of the package folders a fresh clone has (every file, if this is not a checkout)."""
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "--", *PACKAGE_DIRS],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [line for line in out.splitlines() if (ROOT / line).is_file()]
    return [
        str(p.relative_to(ROOT))
        for folder in PACKAGE_DIRS
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]


def _in_wheel(path: str) -> str:
    folder, _, rest = path.partition("/")
    return f"{PACKAGE_DIRS[folder]}/{rest}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[zipfile.ZipFile, list[str]]:
    src = tmp_path_factory.mktemp("src")
    files = _tracked_package_files()
    for name in [*files, *BUILD_INPUTS]:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--no-index", "--quiet", "--wheel-dir", str(out), str(src)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert "absent from the `packages` configuration" not in build.stderr  # data folder warning
    (path,) = out.glob("cnode-*.whl")
    return zipfile.ZipFile(path), files


def test_wheel_ships_the_training_data_and_py_typed(
    wheel: tuple[zipfile.ZipFile, list[str]],
) -> None:
    names = set(wheel[0].namelist())
    assert {"cnode/node/train/data/corpus.txt", "cnode/node/train/data/tokenizer.json"} <= names
    for folder in PACKAGE_DIRS.values():
        assert f"{folder}/py.typed" in names, folder
    data = wheel[0].read("cnode/node/train/data/tokenizer.json")
    assert data == (ROOT / "node/train/data/tokenizer.json").read_bytes()


def test_wheel_ships_every_tracked_package_file(
    wheel: tuple[zipfile.ZipFile, list[str]],
) -> None:
    names = set(wheel[0].namelist())
    missing = sorted(_in_wheel(f) for f in wheel[1] if _in_wheel(f) not in names)
    assert missing == []
    (entry_points_file,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    entry_points = wheel[0].read(entry_points_file).decode()
    assert "cnode = cnode.node.cli:run" in entry_points
