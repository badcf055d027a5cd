"""storage/_memo.py: manifest nodes parsed once per distinct bytes, never trusted beyond them."""

from __future__ import annotations

import pytest
import torch

from cnode.storage import BlockStore, ManifestError, read_manifest, save_checkpoint
from cnode.storage._cbor import decode, encode
from cnode.storage._manifest import parse_root
from cnode.storage._memo import MEMO_BYTES, MEMO_ENTRIES, ParseMemo

from .conftest import meta


def test_the_same_bytes_are_parsed_once() -> None:
    memo: ParseMemo[list[int]] = ParseMemo(list)
    calls: list[bytes] = []

    def parse(data: bytes) -> list[int]:
        calls.append(data)
        return list(data)

    first = memo.parse(b"abc", lambda: parse(b"abc"))
    again = memo.parse(bytearray(b"abc"), lambda: parse(b"abc"))
    assert first == again == [97, 98, 99] and calls == [b"abc"]
    first.append(0)  # each caller has its own copy: a change does not reach the next
    assert memo.parse(b"abc", lambda: parse(b"abc")) == [97, 98, 99]
    memo.parse(b"abd", lambda: parse(b"abd"))
    assert calls == [b"abc", b"abd"]


def test_a_failed_parse_is_not_kept() -> None:
    memo: ParseMemo[int] = ParseMemo()
    calls = 0

    def bad() -> int:
        nonlocal calls
        calls += 1
        raise ValueError("bad node")

    for _ in range(2):
        with pytest.raises(ValueError, match="bad node"):
            memo.parse(b"x", bad)
    assert calls == 2


def test_bounded_by_entries_and_bytes() -> None:
    memo: ParseMemo[int] = ParseMemo()
    for i in range(MEMO_ENTRIES + 10):
        memo.parse(i.to_bytes(4, "big"), lambda i=i: i)
    assert len(memo._kept) == MEMO_ENTRIES
    big = MEMO_BYTES // 8
    for i in range(12):
        memo.parse(bytes([i]) * big, lambda i=i: i)
    assert memo._bytes <= MEMO_BYTES
    huge = b"\0" * (big + 1)  # over the per-node bound: parsed every time, never kept
    memo.parse(huge, lambda: -1)
    assert all(v != -1 for v, _ in memo._kept.values())


def test_a_kept_root_gives_each_reader_its_own_dicts(store: BlockStore) -> None:
    state = {"w": torch.ones(4)}
    cid = save_checkpoint(store, state, meta(kind="update", extra={"note": {"a": 1}}))
    first = read_manifest(store, cid)
    first.extra["note"]["a"] = 2  # a careless caller
    assert read_manifest(store, cid).extra == {"note": {"a": 1}}


def test_non_canonical_bytes_of_a_kept_node_still_fail(store: BlockStore) -> None:
    cid = save_checkpoint(store, {"w": torch.ones(4)}, meta())
    data = store.get(cid)
    parse_root(data)  # kept now
    value = decode(data)
    value["extra"] = {"x": 1}
    changed = encode(value)
    parse_root(changed)  # other bytes: parsed on their own
    with pytest.raises(ManifestError):
        parse_root(data + b"\0")  # a trailing byte: other bytes, refused as before
