"""Manifest nodes already parsed, remembered by the sha256 of their bytes.

A partitioned round reads the same few update manifests again and again: the fetch walks one to
learn what is missing and to list a partition's chunks, the aggregator and the verifier read it
to load segments, the closure walks it once more. Parsing a 64-layer update root took ~10 ms
idle (25-40 ms on the shared 2-core machine) through ``dag_cbor``/``multiformats``; with
cnode's own decoder (``cnode/_cbor.py``) ~1-2 ms, and the schema checks and CID objects are
still worth keeping. The memo saves every parse but the first of each node's bytes: a 16-member
profile showed the first parses (one per member update per node) were the whole cost. A parse is
a pure function of the node's bytes, so it is kept here under their sha256 digest and taken again
for the same bytes.

Nothing is trusted that was not before: the bytes still come from the caller (a store read, which
verifies them against their CID, or bytes just received and hashed), the key is computed here
from those very bytes, and only successful strict parses are kept (a node that fails is parsed,
and fails, every time). The sha256 of a node (at most 1 MiB) costs well under a millisecond.
Bounded: at most MEMO_ENTRIES nodes of MEMO_BYTES of node bytes in all, least recently used
dropped first.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

# Enough for every manifest of a few rounds of a 16-member partitioned run (an update root of
# 64 segments is ~6 KB). Parsed values are a few times their bytes: ~50 MB at the very most.
MEMO_ENTRIES = 256
MEMO_BYTES = 8 << 20

T = TypeVar("T")


class ParseMemo(Generic[T]):
    """An LRU of ``parse(data)`` results keyed by sha256(data); safe from several threads.

    ``copy`` makes what the caller gets from what is kept (the parsed value may hold dicts a
    caller could change: each caller gets its own).
    """

    def __init__(self, copy: Callable[[T], T] = lambda value: value) -> None:
        self._kept: OrderedDict[bytes, tuple[T, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._copy = copy

    def parse(self, data: bytes | bytearray | memoryview, parse: Callable[[], T]) -> T:
        """``parse()`` (which parses ``data``), or what it gave for the same bytes before."""
        size = len(data)
        if size > MEMO_BYTES // 8:  # a large page: parsed each time, never crowds the rest out
            return parse()
        key = hashlib.sha256(data).digest()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return self._copy(kept[0])
        value = parse()  # raises for a bad node: nothing is kept
        with self._lock:
            if key not in self._kept:
                self._kept[key] = (value, size)
                self._bytes += size
            while len(self._kept) > MEMO_ENTRIES or self._bytes > MEMO_BYTES:
                self._bytes -= self._kept.popitem(last=False)[1][1]
        return self._copy(value)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0
