"""Every ``cnode`` command the README shows parses with the CLI's own parser (issue 40): a
renamed or removed option fails here, not in a newcomer's terminal."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cnode.node.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _commands(text: str) -> list[str]:
    """The ``cnode ...`` commands of the README's shell blocks, continuation lines joined and
    comments dropped."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["cnode"]:
                out.append(shlex.join(words))
    return out


COMMANDS = _commands(README.read_text())


def test_the_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 20, COMMANDS  # the blocks were found and read


@pytest.mark.parametrize("command", COMMANDS)
def test_each_readme_command_parses(command: str) -> None:
    try:
        build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit as exc:
        raise AssertionError(f"the README's command does not parse: {command}") from exc


def test_the_readme_is_short_and_dates_no_figure() -> None:
    """At most 220 lines; dated figures live in docs/benchmarks.md."""
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text), "a dated figure: docs/benchmarks.md"
