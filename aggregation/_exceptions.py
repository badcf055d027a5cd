"""Exceptions raised by :mod:`cnode.aggregation`.

The tree::

    CnodeError
    └── AggregationError                 anything this package refuses to do
        ├── AggregatorConfigError        the caller asked for an unknown rule or a bad parameter
        ├── AggregationInputError        the caller passed malformed arguments (specs, weights,
        │                                previous aggregate); local misuse, not a peer's fault
        ├── NotEnoughUpdatesError        too few valid updates survived validation
        └── UpdateEncodingError          a peer's encoded update bytes are malformed (codec)

A *peer's* bad update is never an exception: :func:`~cnode.aggregation.aggregate` records it in
``PeerRecord.rejected`` with the reason and leaves it out of the math, so one bad peer cannot stop
a round. Decoding happens before that, one update at a time: the caller catches
``UpdateEncodingError`` and leaves that peer out with its message as the reason.
"""

from cnode import CnodeError

__all__ = [
    "AggregationError",
    "AggregationInputError",
    "AggregatorConfigError",
    "NotEnoughUpdatesError",
    "UpdateEncodingError",
]


class AggregationError(CnodeError):
    """Raised by cnode.aggregation when an aggregation cannot be done; the message says why."""


class AggregatorConfigError(AggregationError):
    """Raised by AggregatorConfig and aggregate() when the rule name or a parameter is invalid."""


class AggregationInputError(AggregationError):
    """Raised by aggregate() when the caller's own arguments are malformed (local misuse)."""


class NotEnoughUpdatesError(AggregationError):
    """Raised by aggregate() when fewer valid updates remain than the rule needs."""


class UpdateEncodingError(AggregationError):
    """Raised by decode_update_tensor() when a peer's encoded bytes are malformed (its fault)."""
