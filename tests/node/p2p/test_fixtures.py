"""specs/fixtures/blocks and specs/fixtures/announce decode exactly as the specs say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from cnode.auth import verify_access_token
from cnode.node.p2p import (
    Announcement,
    BadBlockError,
    announcement_validator,
    limits,
)
from cnode.node.p2p._blocks._exchange import request_blocks
from cnode.node.p2p._blocks._wire import (
    Admit,
    Admitted,
    Block,
    End,
    Error,
    FrameReader,
    Lacking,
    Request,
    decode_frame,
)
from cnode.storage import CID, VerifiedBlock

SPECS = Path(__file__).resolve().parents[3] / "specs" / "fixtures"
BLOCKS = SPECS / "blocks"
ANNOUNCE = SPECS / "announce"


class _Wire:
    """A ByteStream that answers with fixed bytes and records what was written."""

    def __init__(self, answer: bytes) -> None:
        self.answer, self.written = answer, b""

    async def read(self, max_bytes: int) -> bytes:
        await trio.lowlevel.checkpoint()
        out, self.answer = self.answer[:max_bytes], self.answer[max_bytes:]
        return out

    async def write(self, data: bytes) -> None:
        self.written += data

    async def close(self) -> None:
        pass


def _one(name: str) -> object:
    data = (BLOCKS / name).read_bytes()
    return decode_frame(data[0], data[5:])


def test_block_frames_match_description() -> None:
    desc = json.loads((BLOCKS / "fixtures.json").read_text())
    request = _one("request.bin")
    assert request == Request(tuple(CID.parse(c) for c in desc["request.bin"]["cids"]))
    block = _one("block.bin")
    assert isinstance(block, Block) and str(block.cid) == desc["block.bin"]["cid"]
    assert block.data.decode() == desc["block.bin"]["data_utf8"]
    assert _one("lacking.bin") == Lacking((CID.parse(desc["lacking.bin"]["cids"][0]),))
    assert _one("end.bin") == End()
    error = _one("error.bin")
    assert (
        isinstance(error, Error) and error.status == 3 and error.text == desc["error.bin"]["text"]
    )
    for name in ("request.bin", "block.bin", "lacking.bin", "end.bin", "error.bin"):
        assert _one(name).encode() == (BLOCKS / name).read_bytes()  # type: ignore[attr-defined]


def test_exchange_fixture() -> None:
    request = (BLOCKS / "request.bin").read_bytes()
    cids = list(Request.decode(request[5:]).cids)
    got: dict[CID, bytes] = {}

    async def on_block(block: VerifiedBlock) -> None:
        got[block.cid] = block.data

    async def main() -> set[CID]:
        wire = _Wire((BLOCKS / "response-a-lacking-b.bin").read_bytes())
        lacking = await request_blocks(wire, cids, on_block)
        assert wire.written == request
        return lacking

    assert trio.run(main) == {cids[1]}
    assert list(got) == [cids[0]]


def test_bad_block_fixture_is_rejected() -> None:
    desc = json.loads((BLOCKS / "fixtures.json").read_text())["bad-block.bin"]
    cid = CID.parse(desc["cid"])

    async def main() -> None:
        wire = _Wire((BLOCKS / "bad-block.bin").read_bytes())
        with pytest.raises(BadBlockError) as info:
            await request_blocks(wire, [cid], _unexpected)
        assert info.value.computed == desc["computed"]

    trio.run(main)


async def _unexpected(_block: VerifiedBlock) -> None:
    raise AssertionError("a bad block must never be handed on")


@pytest.mark.parametrize("name", ["hold.cbor", "hold-layers.cbor", "update.cbor", "departure.cbor"])
def test_announcement_fixtures(name: str) -> None:
    desc = json.loads((ANNOUNCE / "fixtures.json").read_text())
    validator = announcement_validator(
        desc["run"], lambda peer: peer == desc["signer"], clock=lambda: desc["clock"]
    )
    opened = validator.validate((ANNOUNCE / name).read_bytes(), desc["signer"])
    assert opened.payload == desc[name]
    assert Announcement.from_payload(opened.payload).to_payload() == desc[name]
    assert len((ANNOUNCE / name).read_bytes()) <= limits.MAX_ANNOUNCEMENT_SIZE


def test_frame_reader_reads_whole_response() -> None:
    async def main() -> list[str]:
        reader = FrameReader(_Wire((BLOCKS / "response-a-lacking-b.bin").read_bytes()))
        kinds = []
        while (frame := await reader.read_frame(limits.MAX_FRAME_BODY)) is not None:
            kinds.append(type(frame).__name__)
        return kinds

    assert trio.run(main) == ["Block", "Lacking", "End"]


def test_admission_frames_match_description() -> None:
    desc = json.loads((BLOCKS / "fixtures.json").read_text())
    admit = _one("admit.bin")
    assert isinstance(admit, Admit)
    token = verify_access_token(
        admit.token,
        coordinator_peer_id=desc["admit.bin"]["coordinator"],
        run=desc["admit.bin"]["run"],
        now=desc["admit.bin"]["expires_at"] - 1,
    )
    assert token.peer_id == desc["admit.bin"]["peer"]
    assert _one("admitted.bin") == Admitted(desc["admitted.bin"]["expires_at"])
    for name in ("admit.bin", "admitted.bin"):
        assert _one(name).encode() == (BLOCKS / name).read_bytes()  # type: ignore[attr-defined]
