"""The layering of DESIGN.md, held by reading every module's imports (ast, nothing imported).

Layers: ``storage``, ``aggregation`` and ``auth`` sit under ``node``; ``aggregation`` is pure
(neither storage nor auth); ``storage`` and ``auth`` do not know each other; the ``cnode``
package itself (``cnode/``: the root error, the CBOR walk both layers share) imports no layer.

Private modules (``_name``) are private to their package: a module may import a private module
of its own package or of a package above it (``cnode.storage._cbor`` may use
``cnode._cbor``, ``cnode.node.train._loop`` may use ``cnode.node._config``), never one of a
sibling or of a package below (``cnode.node.cli`` must not import ``cnode.node.train._loop``;
it imports ``cnode.node.train``). Benches are held to the same rule from outside.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# folder -> the package it installs as (pyproject maps the four layers under ``cnode``)
PACKAGES = {
    "cnode": "cnode",
    "node": "cnode.node",
    "storage": "cnode.storage",
    "aggregation": "cnode.aggregation",
    "auth": "cnode.auth",
}

LAYERS = ("cnode.node", "cnode.storage", "cnode.auth", "cnode.aggregation")

# layer -> layers it must never import
FORBIDDEN = {
    "cnode.storage": ("cnode.node", "cnode.auth", "cnode.aggregation"),
    "cnode.auth": ("cnode.node", "cnode.storage", "cnode.aggregation"),
    "cnode.aggregation": ("cnode.node", "cnode.storage", "cnode.auth"),
    "cnode": ("cnode.node", "cnode.storage", "cnode.auth", "cnode.aggregation"),
}


def _module_name(path: Path, root: Path) -> tuple[str, str]:
    """(module, package it lives in) of a source file under ``root``."""
    rel = path.relative_to(root)
    if rel.parts[0] not in PACKAGES:  # bench/, tests/: scripts outside every package
        return f"<{rel}>", "<outside>"
    parts = [*PACKAGES[rel.parts[0]].split("."), *rel.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        name = ".".join(parts[:-1])
        return name, name
    return ".".join(parts), ".".join(parts[:-1])


def _imports(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """(line, dotted target) of every import in the file, relative ones resolved.

    ``from a.b import c`` yields ``a.b`` and ``a.b.c`` (c may be a module).
    """
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            if _private_owner(module) is None:  # else the module alone is the finding
                for alias in node.names:
                    yield node.lineno, f"{module}.{alias.name}"


def _layer_of(name: str) -> str:
    """``cnode.storage._car`` -> ``cnode.storage``; ``cnode._cbor`` -> ``cnode``."""
    parts = name.split(".")
    if len(parts) > 1 and f"cnode.{parts[1]}" in LAYERS:
        return f"cnode.{parts[1]}"
    return parts[0]


def _private_owner(target: str) -> str | None:
    """The package whose private module ``target`` names, or None if it names none."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def violations(root: Path = ROOT) -> list[str]:
    """Every import that breaks the rules above, as ``file:line: module imports target (why)``."""
    files = [p for folder in PACKAGES for p in sorted((root / folder).rglob("*.py"))]
    files += sorted((root / "bench").glob("*.py"))
    out = []
    for path in files:
        module, package = _module_name(path, root)
        if module == "cnode.__main__":  # ``python -m cnode``: the program, above every layer
            continue
        layer = _layer_of(module) if package != "<outside>" else "<outside>"
        for line, target in _imports(path, package):
            if not target.startswith("cnode"):
                continue
            where = f"{path.relative_to(root)}:{line}: {module} imports {target}"
            target_layer = _layer_of(target)
            if target_layer in FORBIDDEN.get(layer, ()):
                out.append(f"{where} ({layer} must not import {target_layer})")
            owner = _private_owner(target)
            if owner is not None and not (package == owner or package.startswith(owner + ".")):
                out.append(f"{where} (a private module of another package)")
    return sorted(set(out))


def test_layers_import_only_downwards() -> None:
    found = violations()
    assert not found, "imports against the layering:\n" + "\n".join(found)


# ``cnode.node.train``'s sub-packages in the order they may import each other: a sub-package
# imports only those of a lower rank (its own modules aside). ``scores`` and ``partition`` share
# a rank: neither imports the other. The modules at the top of ``train`` (the round, the trainer,
# the loop) are outside the order: they join the stages together.
TRAIN_ORDER = {
    "model": 0,
    "scores": 1,
    "partition": 1,
    "checkpoint": 2,
    "swarm": 3,
    "exchange": 4,
    "demo": 5,
}
_TRAIN = "cnode.node.train"


def _train_sub(name: str) -> str | None:
    """``cnode.node.train.scores._spread`` -> ``scores``; None outside a sub-package."""
    if not name.startswith(_TRAIN + "."):
        return None
    part = name[len(_TRAIN) + 1 :].split(".")[0]
    return part if part in TRAIN_ORDER else None


def train_order_violations(root: Path = ROOT) -> list[str]:
    """Every import of a train sub-package by one of an equal or lower rank."""
    out = []
    for path in sorted((root / "node" / "train").rglob("*.py")):
        module, package = _module_name(path, root)
        own = _train_sub(module)
        if own is None:
            continue
        for line, target in _imports(path, package):
            other = _train_sub(target)
            if other is not None and other != own and TRAIN_ORDER[other] >= TRAIN_ORDER[own]:
                out.append(
                    f"{path.relative_to(root)}:{line}: {module} imports {target} "
                    f"({own} comes before {other} in TRAIN_ORDER)"
                )
    return sorted(set(out))


def test_train_sub_packages_import_only_earlier_ones() -> None:
    found = train_order_violations()
    assert not found, "train sub-packages against TRAIN_ORDER:\n" + "\n".join(found)
    subs = {p.name for p in (ROOT / "node" / "train").iterdir() if (p / "__init__.py").exists()}
    assert subs == set(TRAIN_ORDER), "a train sub-package missing from TRAIN_ORDER (or gone)"


def test_the_train_order_check_sees_a_bad_import(tmp_path: Path) -> None:
    train = tmp_path / "node" / "train"
    for sub in ("model", "scores", "partition", "exchange"):
        (train / sub).mkdir(parents=True)
        (train / sub / "__init__.py").write_text("")
    (train / "model" / "_a.py").write_text("from ..scores import x\n")
    (train / "scores" / "_b.py").write_text("from ..partition import y\n")
    (train / "exchange" / "_c.py").write_text("from ..model import z\nfrom .. import limits\n")
    found = "\n".join(train_order_violations(tmp_path))
    assert "cnode.node.train.model._a imports cnode.node.train.scores (model comes before" in found
    assert "cnode.node.train.scores._b imports cnode.node.train.partition (scores comes" in found
    assert "exchange._c" not in found


def test_the_check_sees_a_bad_import(tmp_path: Path) -> None:
    """The rules fire on a copy of the tree with bad imports added (guards the test itself)."""
    for folder in [*PACKAGES, "bench"]:
        (tmp_path / folder).mkdir()
    (tmp_path / "storage" / "_a.py").write_text("from cnode.node.p2p import P2PNode\n")
    (tmp_path / "aggregation" / "_b.py").write_text("from ..auth import sign\n")
    (tmp_path / "auth" / "_c.py").write_text("import cnode.storage\n")
    (tmp_path / "cnode" / "_d.py").write_text("from cnode.aggregation import mean\n")
    (tmp_path / "node" / "cli").mkdir()
    (tmp_path / "node" / "cli" / "_e.py").write_text("from cnode.node.train._loop import x\n")
    (tmp_path / "node" / "train").mkdir()
    (tmp_path / "node" / "train" / "_f.py").write_text("from cnode.node import _config\n")
    (tmp_path / "bench" / "g.py").write_text("from cnode.storage._cid import CID\n")
    found = "\n".join(violations(tmp_path))
    assert "cnode.storage._a imports cnode.node.p2p (cnode.storage must not" in found
    assert "cnode.aggregation._b imports cnode.auth (cnode.aggregation must not" in found
    assert "cnode.auth._c imports cnode.storage (cnode.auth must not" in found
    assert "cnode._d imports cnode.aggregation (cnode must not" in found
    assert "imports cnode.node.train._loop (a private module of another package)" in found
    assert "cnode.node.train._f" not in found  # a package above's private module is shared
    assert "<bench/g.py> imports cnode.storage._cid (a private" in found


def import_cycles(folder: str, root: Path = ROOT) -> list[list[str]]:
    """Cycles among the modules of one package folder (lazy imports inside functions count)."""
    package = PACKAGES[folder]
    graph: dict[str, set[str]] = {}
    for path in sorted((root / folder).rglob("*.py")):
        module, parent = _module_name(path, root)
        graph[module] = {
            target
            for _line, target in _imports(path, parent)
            if target.startswith(package + ".") and target != module
        }
    modules = set(graph)
    for module, targets in graph.items():  # ``from . import _x`` names a module, keep modules
        named = {t if t in modules else t.rsplit(".", 1)[0] for t in targets} & modules
        # ``from . import limits`` names the package being imported: not an edge back to it
        graph[module] = {t for t in named if not module.startswith(t + ".") and t != module}
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                cycle = path[path.index(target) :]
                start = cycle.index(min(cycle))
                cycle = cycle[start:] + cycle[:start]
                if cycle not in cycles:
                    cycles.append(cycle)
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        visit(module, [module])
    return cycles


@pytest.mark.parametrize(
    "folder",
    [
        "cnode",
        "storage",
        "auth",
        "aggregation",
        "node",
    ],
)
def test_no_import_cycles(folder: str) -> None:
    assert import_cycles(folder) == []


# ``cnode.node.coordinator``'s parts in the order they may import each other (issue 40): the
# store is the only code that speaks SQL, the rules (``_bans``, ``_rounds``) are logic over its
# typed rows, the HTTP layer holds every handler. A part imports only parts of a lower rank (its
# own modules aside). ``__init__`` (the public surface) is outside the order.
COORDINATOR_ORDER = {
    "limits": 0,
    "_codes": 0,
    "_exceptions": 1,
    "_config": 2,
    "_pace": 2,
    "_wire": 3,
    "_client": 4,
    "_store": 4,
    "_bans": 5,
    "_rounds": 6,
    "_gossip": 7,
    "_process": 7,
    "_http": 7,
    "server": 8,
}
_COORDINATOR = "cnode.node.coordinator"
# What the rules may use of the store: its typed rows, facts and writes, never the SQL.
RULES = ("_bans", "_rounds")
RULES_MAY_USE_OF_STORE = {"_rows", "_facts", "_writes"}
# Modules that do I/O or read the clock: none of them in the rules.
NOT_IN_RULES = {"sqlite3", "aiohttp", "asyncio", "httpx", "time", "structlog", "trio", "anyio"}


def _coordinator_part(name: str) -> str | None:
    """``cnode.node.coordinator._store._rows`` -> ``_store``; None outside the coordinator."""
    if not name.startswith(_COORDINATOR + "."):
        return None
    return name[len(_COORDINATOR) + 1 :].split(".")[0]


def coordinator_order_violations(root: Path = ROOT) -> list[str]:
    """Every import of a coordinator part by one of an equal or lower rank, and every use of
    the store's SQL or of an I/O module by the rules."""
    out = []
    for path in sorted((root / "node" / "coordinator").rglob("*.py")):
        module, package = _module_name(path, root)
        own = _coordinator_part(module)
        if own is None:
            continue
        for line, target in _imports(path, package):
            where = f"{path.relative_to(root)}:{line}: {module} imports {target}"
            if own in RULES and target.split(".")[0] in NOT_IN_RULES:
                out.append(f"{where} (the rules do no I/O)")
            other = _coordinator_part(target)
            if other is None or other == own:
                continue
            if other not in COORDINATOR_ORDER or own not in COORDINATOR_ORDER:
                out.append(f"{where} ({other if other not in COORDINATOR_ORDER else own} "
                           "is missing from COORDINATOR_ORDER)")  # fmt: skip
            elif COORDINATOR_ORDER[other] >= COORDINATOR_ORDER[own]:
                out.append(f"{where} ({own} comes before {other} in COORDINATOR_ORDER)")
            if own in RULES and other == "_store":
                used = target[len(_COORDINATOR) + len("._store.") :].split(".")[0]
                if used and used not in RULES_MAY_USE_OF_STORE:
                    out.append(f"{where} (the rules use the store's rows, never its SQL)")
    return sorted(set(out))


def test_the_coordinator_parts_import_only_earlier_ones() -> None:
    found = coordinator_order_violations()
    assert not found, "coordinator parts against COORDINATOR_ORDER:\n" + "\n".join(found)
    folder = ROOT / "node" / "coordinator"
    parts = {p.stem for p in folder.glob("*.py")} | {
        p.name for p in folder.iterdir() if (p / "__init__.py").exists()
    }
    assert parts - {"__init__"} == set(COORDINATOR_ORDER), "a part missing from the order"


def test_the_coordinator_order_check_sees_a_bad_import(tmp_path: Path) -> None:
    coordinator = tmp_path / "node" / "coordinator"
    for sub in ("_store", "_rounds", "_http"):
        (coordinator / sub).mkdir(parents=True)
        (coordinator / sub / "__init__.py").write_text("")
    (coordinator / "_store" / "_a.py").write_text("from .._http._server import x\n")
    (coordinator / "_rounds" / "_b.py").write_text(
        "import sqlite3\nfrom .._store._store import S\n"
    )
    (coordinator / "_rounds" / "_c.py").write_text("from .._store._rows import RoundRow\n")
    (coordinator / "_http" / "_d.py").write_text("from .._rounds._machine import RunMachine\n")
    found = "\n".join(coordinator_order_violations(tmp_path))
    assert "_store._a imports cnode.node.coordinator._http._server (_store comes before" in found
    assert "_rounds._b imports sqlite3 (the rules do no I/O)" in found
    assert "_rounds._b imports cnode.node.coordinator._store._store (the rules use" in found
    assert "_rounds._c" not in found and "_http._d" not in found
