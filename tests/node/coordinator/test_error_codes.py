"""The error-code registry (issue 28): every code the coordinator can send is an ``ErrorCode``
with one status and a meaning, every refusal in the source is raised through it, and
specs/coordinator.md's Status codes table is the registry, row for row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cnode.node.coordinator import ERRORS, ErrorCode, RequestRefused

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "node" / "coordinator"
# The names under which a module holds the registry's enum.
_ENUM_NAMES = {"E", "ErrorCode"}
# The refusal types and the position of their code argument.
_REFUSALS = {"RequestRefused": 0, "RateLimitedRefusal": 1}


def _refusal_codes() -> tuple[set[str], list[str]]:
    """The ErrorCode members every refusal in the source names, and the calls that name none."""
    used: set[str] = set()
    loose: list[str] = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name not in _REFUSALS:
                continue
            where = f"{path.name}:{node.lineno}"
            position = _REFUSALS[name]
            arg: ast.expr | None = None
            if len(node.args) > position:
                arg = node.args[position]
            else:
                arg = next((k.value for k in node.keywords if k.arg == "code"), None)
            if arg is None and name == "RateLimitedRefusal":
                used.add("RATE_LIMITED")  # its default code
                continue
            if (
                isinstance(arg, ast.Attribute)
                and isinstance(arg.value, ast.Name)
                and arg.value.id in _ENUM_NAMES
            ):
                used.add(arg.attr)
            else:
                loose.append(f"{where} {ast.unparse(node)[:80]}")
    return used, loose


def test_every_refusal_names_a_registered_code() -> None:
    used, loose = _refusal_codes()
    assert not loose, f"refusals whose code is not an ErrorCode member: {loose}"
    unknown = used - set(ErrorCode.__members__)
    assert not unknown, unknown


def test_every_code_is_sent_somewhere_and_has_a_status_and_meaning() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in SOURCE.rglob("*.py"))
    sent = set(re.findall(r"\bE\.([A-Z_]+)\b", text))
    assert set(ErrorCode.__members__) - {"RATE_LIMITED"} <= sent, "codes nothing sends"
    assert set(ERRORS) == set(ErrorCode)
    for code, info in ERRORS.items():
        assert 400 <= info.status < 600, code
        assert info.meaning.strip() and "\n" not in info.meaning, code
        assert str(code) == code.name.lower()


def test_a_code_outside_the_registry_cannot_be_raised() -> None:
    refused = RequestRefused(ErrorCode.BUSY, "all checks in use")
    assert (refused.status, refused.code) == (429, "busy")
    with pytest.raises(ValueError, match="not_a_code"):
        RequestRefused("not_a_code", "x")  # type: ignore[arg-type]


def test_the_spec_lists_the_registry() -> None:
    spec = (ROOT / "specs" / "coordinator.md").read_text(encoding="utf-8")
    section = spec.split("## Status codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \| (.+) \|$", section, re.MULTILINE)
    listed = {code: (int(status), meaning) for code, status, meaning in rows}
    assert len(rows) == len(listed), "a code listed twice"
    assert listed == {str(c): (i.status, i.meaning) for c, i in ERRORS.items()}


def test_codes_the_client_raises_itself_are_registered() -> None:
    """The client refuses some requests locally, as the server would (same code and status)."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "CoordinatorRejected":
                status, code = node.args[0], node.args[1]
                if isinstance(status, ast.Constant) and isinstance(code, ast.Constant):
                    found.append((path.name, status.value, code.value))
    assert found, "the scan found none: has the client changed?"
    for name, status, code in found:
        assert ERRORS[ErrorCode(code)].status == status, (name, status, code)
