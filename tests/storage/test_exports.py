import cnode.storage as storage
from cnode import CnodeError


def test_all_sorted_and_resolves() -> None:
    assert storage.__all__ == sorted(storage.__all__)
    for name in storage.__all__:
        assert getattr(storage, name) is not None


def test_errors_hang_from_cnode_error() -> None:
    for name in storage.__all__:
        obj = getattr(storage, name)
        if isinstance(obj, type) and name.endswith("Error"):
            assert issubclass(obj, CnodeError), name


def test_import_does_not_pull_in_torch() -> None:
    # every `cnode` command imports cnode.storage; torch costs seconds of start-up
    import subprocess
    import sys

    code = "import sys, cnode.storage; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
