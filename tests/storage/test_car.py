from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cnode.storage import (
    DAG_CBOR,
    BlockStore,
    CARError,
    compute_cid,
    export_car,
    import_car,
    load_checkpoint,
    read_manifest,
    save_checkpoint,
    unixfs_view,
    verify_car,
)
from cnode.storage._cbor import encode
from cnode.storage._cid import varint

from .conftest import meta, small_state, snapshot


@pytest.fixture
def car(tmp_path: Path) -> tuple[Path, object, dict[str, torch.Tensor]]:
    src = BlockStore(tmp_path / "src")
    state = small_state()
    cid = save_checkpoint(src, state, meta(tokenizer_files={"vocab.json": b"{}"}))
    path = tmp_path / "ckpt.car"
    view = len(unixfs_view(src, cid).blocks)  # the UnixFS view: directory, file node, header...
    assert export_car(src, cid, path) == 1 + 6 + 1 + view  # manifest, 6 chunks, 1 file chunk
    return path, cid, state


def _sections(path: Path) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """Split a CAR into header bytes and (cid bytes, data) sections; test helper."""
    data = path.read_bytes()
    pos = 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            b = data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    n = varint()
    header = data[pos : pos + n]
    pos += n
    sections = []
    while pos < len(data):
        n = varint()
        section = data[pos : pos + n]
        pos += n
        sections.append((section[:36], section[36:]))
    return header, sections


def _write(path: Path, header: bytes, sections: list[tuple[bytes, bytes]]) -> Path:
    out = varint(len(header)) + header
    for cid, block in sections:
        out += varint(len(cid) + len(block)) + cid + block
    path.write_bytes(out)
    return path


def test_round_trip(car, store: BlockStore) -> None:  # type: ignore[no-untyped-def]
    path, cid, state = car
    _header, sections = _sections(path)
    assert sections[0][0] == bytes(cid)  # root first
    assert import_car(store, path) == cid
    assert store.pins() == {str(cid): cid}
    loaded, _manifest = load_checkpoint(store, cid)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert verify_car(path).ok
    assert list((store.root / "tmp").iterdir()) == []


def test_car_header_is_ipld_standard(car) -> None:  # type: ignore[no-untyped-def]
    import dag_cbor

    path, cid, _ = car
    header, _ = _sections(path)
    decoded: Any = dag_cbor.decode(header)
    assert decoded["version"] == 1 and bytes(decoded["roots"][0]) == bytes(cid)


def _bad_cars(path: Path, tmp: Path) -> dict[str, tuple[Path, str]]:
    header, sections = _sections(path)
    cid0, data0 = sections[1]
    other = compute_cid(b"\xa0", DAG_CBOR)
    return {
        "truncated": ((tmp / "t.car"), "truncated CAR"),
        "root absent": (_write(tmp / "r.car", header, sections[1:]), "root .* is not in the CAR"),
        "bad block": (
            _write(tmp / "b.car", header, [sections[0], (cid0, data0[:-1] + b"!"), *sections[2:]]),
            "does not match its CID",
        ),
        "incomplete": (  # a data chunk left out (the store already holds same-shape views)
            _write(tmp / "i.car", header, [sections[0], *sections[2:]]),
            "incomplete CAR",
        ),
        "two roots": (
            _write(tmp / "2.car", encode({"roots": [other, other], "version": 1}), sections),
            "exactly one root",
        ),
        "version 2": (
            _write(tmp / "v.car", encode({"roots": [other], "version": 2}), sections),
            "version 2",
        ),
        "garbage": (tmp / "g.car", "malformed CAR header"),
        "empty": (tmp / "e.car", "empty"),
        "oversize section": (
            _write(tmp / "o.car", header, [sections[0], (cid0, bytes((1 << 20) + 100))]),
            "exceeds MAX_CAR_SECTION_SIZE",
        ),
        "bad cid": (
            _write(tmp / "c.car", header, [(b"\x01\xa9\x02" + cid0[2:], data0), *sections]),
            "codec 0x129",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "truncated",
        "root absent",
        "bad block",
        "incomplete",
        "two roots",
        "version 2",
        "garbage",
        "empty",
        "bad cid",
        "oversize section",
    ],
)
def test_bad_car_leaves_store_unchanged(car, store: BlockStore, tmp_path: Path, case: str) -> None:  # type: ignore[no-untyped-def]
    path, _, _ = car
    cases = _bad_cars(path, tmp_path)
    (tmp_path / "t.car").write_bytes(path.read_bytes()[:-100])
    (tmp_path / "g.car").write_bytes(b"\x05hello world")
    (tmp_path / "e.car").write_bytes(b"")
    bad, message = cases[case]
    save_checkpoint(store, small_state(3), meta())  # something already stored
    before = snapshot(store)
    with pytest.raises(CARError, match=message):
        import_car(store, bad)
    assert snapshot(store) == before
    assert list((store.root / "tmp").iterdir()) == []
    report = verify_car(bad)
    assert not report.ok and report.faults


def test_export_needs_every_block(store: BlockStore, tmp_path: Path) -> None:
    cid = save_checkpoint(store, small_state(), meta())
    store.delete(read_manifest(store, cid).layers[0].chunks[0])
    with pytest.raises(CARError, match="1 blocks missing"):
        export_car(store, cid, tmp_path / "x.car")
    assert not (tmp_path / "x.car").exists()


def test_export_to_a_path_that_cannot_be_written_is_a_car_error(
    store: BlockStore, tmp_path: Path
) -> None:
    cid = save_checkpoint(store, {"w": torch.zeros(2)}, meta())
    with pytest.raises(CARError, match=r"cannot write .*missing/x\.car: No such file"):
        export_car(store, cid, tmp_path / "missing" / "x.car")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CARError, match=r"cannot write .*file/x\.car: Not a directory"):
        export_car(store, cid, tmp_path / "file" / "x.car")
    (tmp_path / "dir.car").mkdir()  # the final rename fails: the temp file is removed
    with pytest.raises(CARError, match=r"cannot write .*dir\.car"):
        export_car(store, cid, tmp_path / "dir.car")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.car", "file", "store"]


def test_a_unixfs_car_is_named_as_such(tmp_path: Path, store: BlockStore) -> None:
    """An IPFS CAR of a file or folder (dag-pb root) is not called a malformed header."""
    import hashlib

    import dag_cbor
    from multiformats import CID as MFCID
    from multiformats import multihash

    node = b"\x0a\x02\x08\x01"  # a dag-pb node with UnixFS data: an empty folder
    root = MFCID("base32", 1, "dag-pb", multihash.wrap(hashlib.sha256(node).digest(), "sha2-256"))
    header = dag_cbor.encode({"roots": [root], "version": 1})
    path = _write(tmp_path / "unixfs.car", header, [(bytes(root), node)])
    with pytest.raises(CARError, match=f"root {root} is dag-pb .*UnixFS.*not a cnode manifest"):
        import_car(store, path)
    assert not verify_car(path).ok
