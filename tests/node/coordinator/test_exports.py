"""cnode.node.coordinator's public surface: sorted ``__all__``, every name resolves."""

from __future__ import annotations

import cnode.node.coordinator as coordinator


def test_all_is_sorted_and_resolves() -> None:
    assert coordinator.__all__ == sorted(coordinator.__all__)
    for name in coordinator.__all__:
        assert getattr(coordinator, name) is not None, name


def test_exceptions_hang_from_cnode_error() -> None:
    from cnode import CnodeError

    for name in (
        "BadRunState",
        "CoordinatorRejected",
        "CoordinatorUnavailable",
        "RateLimited",
        "RequestRefused",
        "RunConfigError",
    ):
        assert issubclass(getattr(coordinator, name), coordinator.CoordinatorError)
    assert issubclass(coordinator.CoordinatorError, CnodeError)
