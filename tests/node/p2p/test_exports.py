import cnode.node.p2p as p2p
from cnode import CnodeError


def test_all_sorted_and_resolves() -> None:
    assert p2p.__all__ == sorted(p2p.__all__)
    for name in p2p.__all__:
        assert getattr(p2p, name) is not None


def test_errors_hang_from_cnode_error() -> None:
    for name in p2p.__all__:
        obj = getattr(p2p, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, CnodeError), name
