import cnode.auth as auth
from cnode import CnodeError


def test_all_sorted_and_resolves() -> None:
    assert auth.__all__ == sorted(auth.__all__)
    for name in auth.__all__:
        assert getattr(auth, name) is not None


def test_errors_hang_from_cnode_error() -> None:
    for name in auth.__all__:
        obj = getattr(auth, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, CnodeError), name
