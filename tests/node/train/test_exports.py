"""cnode.node.train re-exports its public names once, in a sorted __all__."""

from __future__ import annotations

import cnode.node.train as train


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert train.__all__ == sorted(train.__all__)
    assert len(set(train.__all__)) == len(train.__all__)
    for name in train.__all__:
        assert getattr(train, name) is not None
