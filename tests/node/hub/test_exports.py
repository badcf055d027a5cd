"""cnode.node.hub re-exports its public names once, in a sorted __all__."""

from __future__ import annotations

import cnode.node.hub as hub


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert hub.__all__ == sorted(hub.__all__)
    assert len(set(hub.__all__)) == len(hub.__all__)
    for name in hub.__all__:
        assert getattr(hub, name) is not None
