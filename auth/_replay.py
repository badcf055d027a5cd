"""Replay protection for signed messages. See specs/identity.md#replay.

Every signed message that could be replayed carries its run id and either a per-signer monotonic
counter or a (round, kind) pair. A verifier keeps, per signer and run (and kind), the highest value
it accepted; the same value again is a duplicate, a lower one is stale. The signature must be
checked first: only then is the signer's claim to the counter worth remembering.
"""

from __future__ import annotations

from collections import OrderedDict

from . import limits
from ._exceptions import ReplayError

_Key = tuple[str, str, str]


class ReplayGuard:
    """Remembers the highest counter / round accepted per (signer, run[, kind]).

    Memory is bounded by ``max_keys``: beyond it the least recently used key is forgotten (a
    forgotten key accepts anything newer than nothing, so size it to the run's members x kinds).
    Not thread-safe; one guard per event loop.
    """

    def __init__(self, max_keys: int = limits.REPLAY_MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self._max_keys = max_keys
        self._highest: OrderedDict[_Key, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._highest)

    def _accept(self, key: _Key, value: int, what: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ReplayError(f"{what} must be a non-negative integer, got {value!r}")
        signer, run, kind = key
        label = f"{kind} " if kind else ""
        last = self._highest.get(key)
        if last is not None:
            if value == last:
                raise ReplayError(
                    f"duplicate {label}message from {signer} in run {run!r}: {what} {value} "
                    "was already accepted"
                )
            if value < last:
                raise ReplayError(
                    f"stale {label}message from {signer} in run {run!r}: {what} {value} "
                    f"is older than {last}"
                )
            self._highest.move_to_end(key)
        self._highest[key] = value
        while len(self._highest) > self._max_keys:
            self._highest.popitem(last=False)

    def check(self, signer: str, run: str, counter: int) -> None:
        """Accept ``counter`` from ``signer`` in ``run`` if it is higher than any accepted before.

        Raises ReplayError (duplicate or stale); nothing is recorded then.
        """
        self._accept((signer, run, ""), counter, "counter")

    def check_round(self, signer: str, run: str, round: int, kind: str) -> None:
        """Accept a ``kind`` message for ``round`` unless one for this or a later round was seen.

        Raises ReplayError (duplicate or stale); nothing is recorded then.
        """
        if not kind:
            raise ValueError("kind must be a non-empty string")
        self._accept((signer, run, kind), round, "round")

    def highest(self, signer: str, run: str, kind: str = "") -> int | None:
        """The highest counter (``kind=""``) or round of ``kind`` accepted so far, if any."""
        return self._highest.get((signer, run, kind))
