"""aggregation/_codec.py: update codecs round-trip, match the spec's fixture, decode the same bytes
on any thread count, and refuse malformed encodings with a reason."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from cnode.aggregation import (
    CODECS,
    AggregationInputError,
    UpdateEncodingError,
    decode_update_tensor,
    encode_update_tensor,
    encoded_nbytes,
    limits,
)

FIXTURES = Path(__file__).resolve().parents[2] / "specs" / "fixtures" / "training"
INT8 = "int8-blockwise"


def _fixture_input() -> torch.Tensor:
    spec = importlib.util.spec_from_file_location("make", FIXTURES / "make_codec_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fixture_input()  # type: ignore[no-any-return]


def _sample(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.logspace(-4, 1, n)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (4096,), (4097,), (3, 5000)])
def test_round_trip_sizes_and_error_bounds(codec: str, shape: tuple[int, ...]) -> None:
    x = _sample(math.prod(shape)).reshape(shape)
    encoded = encode_update_tensor(x, codec)
    assert encoded.numel() * encoded.element_size() == encoded_nbytes(x.numel(), codec)
    decoded = decode_update_tensor(encoded, codec, shape)
    assert decoded.dtype == torch.float32 and tuple(decoded.shape) == shape
    if codec == "f32":
        assert torch.equal(decoded, x)
    elif codec == "bf16":
        assert torch.equal(decoded, x.to(torch.bfloat16).to(torch.float32))
    elif codec == "sparse-topk":  # at most K per chunk, each kept value where the input was
        back = decoded.reshape(-1)
        for start in range(0, back.numel(), limits.SPARSE_CHUNK):
            assert int((back[start : start + limits.SPARSE_CHUNK] != 0).sum()) <= 64
        assert bool((x.reshape(-1)[back != 0] != 0).all())
    else:  # each value within half a step (absmax / 254) of its block
        flat, back = x.reshape(-1), decoded.reshape(-1)
        for start in range(0, flat.numel(), limits.CODEC_BLOCK):
            block = flat[start : start + limits.CODEC_BLOCK]
            err = (back[start : start + limits.CODEC_BLOCK] - block).abs().max()
            assert float(err) <= float(block.abs().max()) / 254 * 1.001


def test_int8_bytes_ratio_to_f32_is_at_most_0_2511() -> None:
    n = 10_152_000
    assert encoded_nbytes(n, INT8) / encoded_nbytes(n, "f32") <= 0.2511


def test_zero_block_has_scale_zero_and_decodes_to_zeros() -> None:
    x = torch.zeros(5000)
    x[4500] = 2.0
    encoded = encode_update_tensor(x, INT8)
    scales = encoded[:8].view(torch.float32)
    assert scales.tolist() == [0.0, pytest.approx(2.0 / 127)]
    assert torch.equal(decode_update_tensor(encoded, INT8, (5000,))[:4096], torch.zeros(4096))


def test_the_spec_fixture_is_what_the_code_encodes_and_decodes() -> None:
    want = json.loads((FIXTURES / "update-int8-blockwise.json").read_text())
    data = (FIXTURES / "update-int8-blockwise.bin").read_bytes()
    assert len(data) == want["length"] == 4 * 3 + 9000
    assert hashlib.sha256(data).hexdigest() == want["bytes_sha256"]
    x = _fixture_input()
    assert hashlib.sha256(x.numpy().tobytes()).hexdigest() == want["input_sha256"]
    assert encode_update_tensor(x, INT8).numpy().tobytes() == data
    # The layout, byte by byte: float32 LE scales first, then int8 values.
    scales = torch.frombuffer(bytearray(data[:12]), dtype=torch.float32).tolist()
    assert [s.hex() for s in scales] == want["scales_hex"]
    assert list(torch.frombuffer(bytearray(data[12:20]), dtype=torch.int8)) == want["first_values"]
    decoded = decode_update_tensor(
        torch.frombuffer(bytearray(data), dtype=torch.uint8), INT8, tuple(want["shape"])
    )
    assert hashlib.sha256(decoded.numpy().tobytes()).hexdigest() == want["decoded_sha256"]
    assert [v.hex() for v in decoded.reshape(-1)[:4].tolist()] == want["decoded_first"]
    # value i = int8 x scale of its block, one float32 product: check a few by hand
    q = torch.frombuffer(bytearray(data[12:]), dtype=torch.int8)
    for i in (0, 4095, 4096, 8191, 8192, 8999):
        expect = torch.tensor(float(q[i]), dtype=torch.float32) * torch.tensor(
            scales[i // 4096], dtype=torch.float32
        )
        assert decoded.reshape(-1)[i].item() == expect.item()


def test_decoding_is_bit_identical_across_thread_counts() -> None:
    x = _sample(3 * limits.CODEC_BLOCK * 50 + 123, seed=3)
    encoded = encode_update_tensor(x, INT8)
    before = torch.get_num_threads()
    digests = set()
    try:
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            out = decode_update_tensor(encoded, INT8, tuple(x.shape))
            digests.add(hashlib.sha256(out.numpy().tobytes()).hexdigest())
            again = encode_update_tensor(x, INT8)
            assert torch.equal(again, encoded)
    finally:
        torch.set_num_threads(before)
    assert len(digests) == 1


def _bad(encoded: torch.Tensor, shape: tuple[int, ...], match: str) -> None:
    with pytest.raises(UpdateEncodingError, match=match):
        decode_update_tensor(encoded, INT8, shape)


def test_malformed_int8_encodings_are_refused_with_a_reason() -> None:
    x = _sample(5000)
    good = encode_update_tensor(x, INT8)
    _bad(good[:-1], (5000,), r"length 5007 bytes, expected 5008")
    _bad(torch.cat([good, torch.zeros(1, dtype=torch.uint8)]), (5000,), "length 5009")
    _bad(good, (5001,), "expected 5009")  # a layer of another size
    _bad(good.view(torch.int8), (5000,), "1-D uint8")
    _bad(good.reshape(2, -1), (5000,), "1-D uint8")
    for value, why in ((math.nan, "nan"), (math.inf, "inf"), (-1.0, "-1.0"), (3e37, r"3\.0000")):
        broken = good.clone()
        broken[4:8] = torch.tensor([value], dtype=torch.float32).view(torch.uint8)
        _bad(broken, (5000,), rf"scale of block 1 is {why}")
    broken = good.clone()
    broken[8 + 17] = 128  # int8 -128
    _bad(broken, (5000,), "value 17 is -128")


def test_malformed_f32_and_bf16_encodings_are_refused() -> None:
    x = _sample(12).reshape(3, 4)
    with pytest.raises(UpdateEncodingError, match=r"bf16 stores torch\.bfloat16"):
        decode_update_tensor(x, "bf16", (3, 4))
    with pytest.raises(UpdateEncodingError, match="shape"):
        decode_update_tensor(x.to(torch.bfloat16).reshape(4, 3), "bf16", (3, 4))
    with pytest.raises(UpdateEncodingError, match=r"f32 stores torch\.float32"):
        decode_update_tensor(x.double(), "f32", (3, 4))


def test_nonfinite_input_travels_as_a_scale_that_every_receiver_rejects() -> None:
    x = _sample(5000)
    x[4100] = math.nan
    encoded = encode_update_tensor(x, INT8)
    _bad(encoded, (5000,), "scale of block 1 is nan")
    x[4100] = math.inf
    _bad(encode_update_tensor(x, INT8), (5000,), "scale of block 1 is inf")


def test_local_misuse_is_not_a_peer_fault() -> None:
    with pytest.raises(AggregationInputError, match="unknown update codec 'int4'"):
        encode_update_tensor(torch.zeros(3), "int4")
    with pytest.raises(AggregationInputError, match="float32"):
        encode_update_tensor(torch.zeros(3, dtype=torch.float64), INT8)
