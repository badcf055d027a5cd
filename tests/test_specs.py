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


# Issue 40: the README and the specs name modules and names that exist. Beside full paths, a
# spec names a module by its file (`_slots.py`) or a name in it (`_waits.RoundWaits`,
# `_reputation.replay_round`): the file must exist in the code, and the name be defined there.
DOCS = [*SPECS, ROOT / "README.md"]
CODE = ("cnode", "node", "storage", "auth", "aggregation")
# A path: under a top folder, with a file extension or a trailing slash (not `cnode/request/v1`,
# a payload type); `storage/_unixfs.build_view` names a function of `storage/_unixfs.py`.
_ANY_PATH = re.compile(
    r"`((?:cnode|node|storage|auth|aggregation|bench|tests|docs|specs)/[\w/-]*(?:\.\w+|/))`"
)
_FILE = re.compile(r"`(_\w+\.py)\b")
_DOTTED = re.compile(r"`(_[a-z]\w*)\.(?!py\b)([A-Za-z_]\w*)")


def _modules() -> dict[str, list[Path]]:
    """Module file name -> every file of that name in the code (a package's name, ``_x.py``
    for the folder ``_x/``, -> every file in it)."""
    found: dict[str, list[Path]] = {}
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            found.setdefault(path.name, []).append(path)
            if path.name == "__init__.py":
                found.setdefault(f"{path.parent.name}.py", []).extend(path.parent.glob("*.py"))
    return found


def _defines(path: Path, name: str) -> bool:
    text = path.read_text()
    return bool(re.search(rf"^\s*(?:async def|def|class) {name}\b|^\s*{name}\s*[:=]", text, re.M))


def doc_reference_problems(docs: list[Path] = DOCS) -> list[str]:
    """Every path, module file or module name a document names that the code lacks."""
    modules = _modules()
    out = []
    for doc in docs:
        text = doc.read_text()
        for path in _ANY_PATH.findall(text):
            module, _, attr = path.rpartition(".")
            if (ROOT / path).exists():
                continue
            if (ROOT / f"{module}.py").is_file() and _defines(ROOT / f"{module}.py", attr):
                continue
            out.append(f"{doc.name}: {path} does not exist")
        for name in _FILE.findall(text):
            if name not in modules:
                out.append(f"{doc.name}: no module {name}")
        for module, attr in _DOTTED.findall(text):
            files = modules.get(f"{module}.py")
            if files is None:
                out.append(f"{doc.name}: no module {module}.py (named as {module}.{attr})")
            elif not any(_defines(f, attr) for f in files):
                out.append(f"{doc.name}: {module}.py defines no {attr}")
    return sorted(set(out))


def test_every_path_module_and_name_the_docs_give_exists() -> None:
    problems = doc_reference_problems()
    assert not problems, "documents name what the code lacks:\n" + "\n".join(problems)


def test_the_doc_check_sees_a_stale_name(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "`node/coordinator/_rounds/_waits.py`, `_nowhere.py`, `_machine.RunMachine`, "
        "`_reputation.replay_input`, `_store.Store`\n"
    )
    found = "\n".join(doc_reference_problems([doc]))
    assert "x.md: node/coordinator/_rounds/_waits.py does not exist" in found
    assert "x.md: no module _nowhere.py" in found
    assert "_reputation.py defines no replay_input" in found
    assert "RunMachine" not in found and "Store" not in found
