"""Each package's public surface is its ``__init__``'s ``__all__`` (trio's test_exports, cut down).

For every cnode package: ``__all__`` is sorted and unique, every name in it resolves, no private
name is in it, and every public name the package holds (other than its submodules) is listed:
nothing is public by accident, nothing private leaks.
"""

from __future__ import annotations

import importlib
import types

import pytest

PACKAGES: list[object] = [
    "cnode",
    "cnode.aggregation",
    "cnode.auth",
    "cnode.storage",
    "cnode.node",
    "cnode.node.cli",
    "cnode.node.coordinator",
    "cnode.node.coordinator.server",
    "cnode.node.hub",
    "cnode.node.p2p",
    "cnode.node.train",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_the_public_surface(name: str) -> None:
    package = importlib.import_module(name)
    listed = package.__all__
    assert listed == sorted(listed), f"{name}.__all__ is not sorted"
    assert len(set(listed)) == len(listed), f"{name}.__all__ lists a name twice"
    private = [n for n in listed if n.startswith("_") and n != "__version__"]
    assert not private, f"{name}.__all__ exports private names {private}"
    for item in listed:
        assert hasattr(package, item), f"{name}.__all__ lists {item!r}, which does not resolve"
    public = {  # public classes and functions defined in this package's modules
        attr
        for attr, value in vars(package).items()
        if not attr.startswith("_")
        and not isinstance(value, types.ModuleType)
        and (getattr(value, "__module__", None) or "").startswith(name)
    }
    unlisted = sorted(public - set(listed))
    assert not unlisted, f"{name} holds public names missing from __all__: {unlisted}"


# package -> the root its exported errors hang from; node's package roots hang from NodeError.
ROOTS = {
    "cnode.auth": "AuthError",
    "cnode.storage": "StorageError",
    "cnode.aggregation": "AggregationError",
    "cnode.node": "NodeError",
    "cnode.node.train": "TrainingError",
    "cnode.node.hub": "HubError",
    "cnode.node.p2p": "P2PError",
    "cnode.node.coordinator": "CoordinatorError",
}


@pytest.mark.parametrize(
    "name",
    list(ROOTS),
)
def test_errors_hang_from_the_package_root_and_node_roots_from_node_error(name: str) -> None:
    from cnode import CnodeError
    from cnode.node import NodeError

    package = importlib.import_module(name)
    root = getattr(package, ROOTS[name])
    assert issubclass(root, CnodeError)
    if name.startswith("cnode.node."):
        assert issubclass(root, NodeError), f"{name}.{root.__name__} is not under NodeError"
    for item in package.__all__:
        value = getattr(package, item)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, CnodeError), f"{name}.{item} is not a CnodeError"
            if value.__module__.startswith(name + "."):  # its own, not one re-exported
                assert issubclass(value, root), f"{name}.{item} is not under {root.__name__}"
