"""specs/ point at code: every module path a spec names exists, and every Messages section names
the module that encodes its messages (issue 15)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.md"))
_PATH = re.compile(r"`((?:cnode|node|storage|auth|aggregation)/[\w/]+\.py)`")


def test_every_module_a_spec_names_exists() -> None:
    missing = [
        f"{spec.name}: {path}"
        for spec in SPECS
        for path in _PATH.findall(spec.read_text())
        if not (ROOT / path).is_file()
    ]
    assert not missing, f"specs name modules that do not exist: {missing}"


def test_every_messages_section_names_its_module() -> None:
    unnamed = []
    for spec in SPECS:
        text = spec.read_text()
        match = re.search(r"^## Messages\n(.*?)(?=^## )", text, re.S | re.M)
        if match and not _PATH.search(match.group(1)):
            unnamed.append(spec.name)
    assert not unnamed, f"Messages sections that name no module: {unnamed}"
