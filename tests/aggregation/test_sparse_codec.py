"""aggregation/_sparse.py: the sparse-topk update codec and the sparse-int8 result codec keep the
top K per chunk (ties by offset), match the spec's fixture, decode bit-identically in another
process with another thread count, and refuse each malformed encoding with a reason."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cnode.aggregation import (
    AggregationInputError,
    UpdateEncodingError,
    decode_update_tensor,
    encode_update_tensor,
    encoded_nbytes,
    limits,
    result_codec,
    wire_codec,
)

FIXTURES = Path(__file__).resolve().parents[2] / "specs" / "fixtures" / "training"
SPARSE = "sparse-topk:64"
RESULT = "sparse-int8:128"
C = limits.SPARSE_CHUNK


def _sample(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.logspace(-4, 1, n)


def _decode(encoded: torch.Tensor, n: int, codec: str = SPARSE) -> torch.Tensor:
    return decode_update_tensor(encoded, codec, (n,))


def _bad(encoded: torch.Tensor, n: int, match: str, codec: str = SPARSE) -> None:
    with pytest.raises(UpdateEncodingError, match=match):
        _decode(encoded, n, codec)


def test_wire_codec_names_k_and_the_result_codec_doubles_it_with_8_bits() -> None:
    assert wire_codec("sparse-topk", 1 / 64) == SPARSE
    assert wire_codec("sparse-topk", 1e-9) == "sparse-topk:1"
    assert wire_codec("int8-blockwise", 1 / 64) == "int8-blockwise"
    assert result_codec(SPARSE) == RESULT and result_codec("f32") == "f32"
    assert result_codec("sparse-topk:4000") == f"sparse-int8:{C}"
    for density in (0.0, -1.0, 1.5, math.nan):
        with pytest.raises(AggregationInputError, match="density"):
            wire_codec("sparse-topk", density)
    for codec in ("sparse-topk:0", "sparse-topk:4097", "sparse-topk:x", "sparse-topk:064"):
        with pytest.raises(AggregationInputError, match="K must be"):
            encode_update_tensor(torch.zeros(3), codec)


@pytest.mark.parametrize("codec", [SPARSE, RESULT, "sparse-topk:1024", "sparse-int8:2048"])
@pytest.mark.parametrize("n", [0, 1, 100, C, C + 1, 3 * C + 500])
def test_keeps_the_k_largest_per_chunk_and_fits_the_size_bound(codec: str, n: int) -> None:
    x = _sample(n, seed=n)
    encoded = encode_update_tensor(x, codec)
    assert encoded.numel() <= encoded_nbytes(n, codec)
    back = _decode(encoded, n, codec)
    k = int(codec.split(":")[1])
    for start in range(0, n, C):
        chunk, got = x[start : start + C], back[start : start + C]
        quota = min(chunk.numel(), -(-k * chunk.numel() // C))
        kept = got != 0  # int8 may round a small kept value to 0: then fewer
        topk = codec.startswith("sparse-topk")
        assert int(kept.sum()) == quota if topk else int(kept.sum()) <= quota
        # every kept magnitude >= every dropped one
        dropped = torch.cat([chunk[~kept].abs(), torch.zeros(1)])
        assert float(chunk[kept].abs().min()) >= float(dropped.max())
        assert bool((got[kept].sign() == chunk[kept].sign()).all())


def test_sparse_ratio_to_f32_is_under_one_hundredth() -> None:
    n = 10_152_000
    assert encoded_nbytes(n, SPARSE) / encoded_nbytes(n, "f32") <= 0.0073
    assert encoded_nbytes(n, RESULT) / encoded_nbytes(n, "f32") <= 0.0199


def test_ties_break_by_offset_and_zeros_are_never_kept() -> None:
    x = torch.zeros(C)
    x[[10, 20, 30, 4000]] = torch.tensor([1.0, -1.0, 1.0, 1.0])
    back = _decode(encode_update_tensor(x, "sparse-topk:2"), C)
    assert back.nonzero().reshape(-1).tolist() == [10, 20]
    assert back[10] > 0 > back[20]
    only = _decode(encode_update_tensor(x, "sparse-topk:64"), C)
    assert only.nonzero().reshape(-1).tolist() == [10, 20, 30, 4000]
    empty = encode_update_tensor(torch.zeros(C + 5), SPARSE)
    assert empty.numel() == 12 and not bool(empty.any())  # two zero scales and counts


def test_the_spec_fixture_is_what_the_code_encodes_and_decodes() -> None:
    spec = importlib.util.spec_from_file_location("make", FIXTURES / "make_sparse_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    want = json.loads((FIXTURES / "update-sparse-topk.json").read_text())
    data = (FIXTURES / "update-sparse-topk.bin").read_bytes()
    assert len(data) == want["length"] == 4 + 2 + 96 + 16
    assert hashlib.sha256(data).hexdigest() == want["bytes_sha256"]
    x = module.fixture_input()
    assert hashlib.sha256(x.numpy().tobytes()).hexdigest() == want["input_sha256"]
    assert encode_update_tensor(x, SPARSE).numpy().tobytes() == data
    # Field by field, as specs/aggregation.md#sparse-codecs lays it out.
    scale = torch.frombuffer(bytearray(data[:4]), dtype=torch.float32)
    assert float(scale).hex() == want["scale_hex"]
    assert data[4] | data[5] << 8 == want["count"] == 64
    offsets = []
    for p in range(32):
        b0, b1, b2 = data[6 + 3 * p : 9 + 3 * p]
        offsets += [b0 | (b1 & 0xF) << 8, b1 >> 4 | b2 << 4]
    assert offsets == want["offsets"]
    codes = [(data[102 + t // 4] >> (2 * (t % 4))) & 3 for t in range(64)]
    levels = {0: 0.9375, 1: 1.5, 2: -0.9375, 3: -1.5}
    expect = [(torch.tensor(levels[c], dtype=torch.float32) * scale).item() for c in codes]
    decoded = _decode(torch.frombuffer(bytearray(data), dtype=torch.uint8), 4096)
    assert decoded[offsets].tolist() == expect
    assert [float(v).hex() for v in expect] == want["decoded_kept_hex"]
    assert hashlib.sha256(decoded.numpy().tobytes()).hexdigest() == want["decoded_sha256"]


_CHILD = """
import hashlib, sys, torch
from cnode.aggregation import decode_update_tensor, encode_update_tensor
torch.set_num_threads(1)
x = torch.frombuffer(bytearray(open(sys.argv[1], "rb").read()), dtype=torch.float32)
for codec in sys.argv[2:]:
    data = torch.frombuffer(bytearray(open(sys.argv[1] + codec, "rb").read()), dtype=torch.uint8)
    out = decode_update_tensor(data, codec, (x.numel(),))
    again = encode_update_tensor(x, codec).numpy().tobytes()
    print(torch.get_num_threads(), hashlib.sha256(out.numpy().tobytes()).hexdigest(),
          hashlib.sha256(again).hexdigest())
"""


def test_another_process_with_one_thread_decodes_and_encodes_the_same_bits(
    tmp_path: Path,
) -> None:
    x = _sample(40 * C + 123, seed=5)
    path = tmp_path / "x"
    path.write_bytes(x.numpy().tobytes())
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    want = []
    try:
        for codec in (SPARSE, RESULT):
            encoded = encode_update_tensor(x, codec)
            Path(f"{path}{codec}").write_bytes(encoded.numpy().tobytes())
            here = hashlib.sha256(_decode(encoded, x.numel(), codec).numpy().tobytes())
            want += ["1", here.hexdigest(), hashlib.sha256(encoded.numpy().tobytes()).hexdigest()]
    finally:
        torch.set_num_threads(before)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), SPARSE, RESULT],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert child.stdout.split() == want


def _two_chunks() -> tuple[torch.Tensor, int]:
    n = C + 100
    return encode_update_tensor(_sample(n, seed=9), SPARSE), n


def _set_offsets(good: torch.Tensor, first: int, second: int) -> torch.Tensor:
    """``good`` (two chunks, 64 + 2 values) with the first two offsets replaced."""
    broken = good.clone()
    broken[12:15] = torch.tensor(
        [first & 0xFF, first >> 8 | (second & 0xF) << 4, second >> 4], dtype=torch.uint8
    )
    return broken


def test_truncated_or_too_long_data_is_refused() -> None:
    good, n = _two_chunks()
    _bad(good[:-1], n, "truncated: 127 bytes, expected 128")
    _bad(good[:7], n, "truncated: 7 bytes, the 2 chunk headers need 12")
    _bad(torch.cat([good, torch.zeros(1, dtype=torch.uint8)]), n, "too long")
    _bad(good.view(torch.int8), n, "1-D uint8")


def test_a_chunk_with_too_many_values_is_refused() -> None:
    good, n = _two_chunks()
    broken = good.clone()
    broken[10] = 3  # the short chunk (100 values) may keep 2
    _bad(broken, n, "chunk 1 holds 3 values, more than its 2")
    broken = good.clone()
    broken[8] = 65
    _bad(broken, n, "chunk 0 holds 65 values, more than its 64")


@pytest.mark.parametrize(
    ("value", "why"),
    [(math.nan, "nan"), (math.inf, "inf"), (-1.0, "-1.0"), (3e38, r"3\.0000")],
)
def test_a_nan_inf_negative_or_huge_scale_is_refused(value: float, why: str) -> None:
    good, n = _two_chunks()
    broken = good.clone()
    broken[4:8] = torch.tensor([value], dtype=torch.float32).view(torch.uint8)
    _bad(broken, n, rf"scale of chunk 1 is {why}")


def test_an_empty_chunk_with_a_scale_is_refused() -> None:
    x = torch.zeros(10)
    broken = encode_update_tensor(x, SPARSE).clone()
    broken[:4] = torch.tensor([1.0], dtype=torch.float32).view(torch.uint8)
    _bad(broken, 10, "scale of chunk 0 is 1.0")


def test_an_offset_out_of_range_is_refused() -> None:
    good, n = _two_chunks()
    # the first value of chunk 1 (the 65th, paired with the 66th) at offset 100 of 100
    broken = good.clone()
    at = 12 + 3 * 32
    broken[at] = 100
    broken[at + 1] = (int(good[at + 1]) & 0xF0) | 0
    _bad(broken, n, "offset 100 of value 64 is out of range: chunk 1 has 100 values")


def test_duplicate_or_unsorted_offsets_are_refused() -> None:
    good, n = _two_chunks()
    _bad(
        _set_offsets(good, 7, 7),
        n,
        r"not strictly increasing: value 1 has offset 7 after 7 "
        r"\(duplicate\)",
    )
    _bad(_set_offsets(good, 9, 8), n, r"value 1 has offset 8 after 9 \(unsorted\)")


def test_set_padding_bits_and_int8_minus_128_are_refused() -> None:
    x = torch.zeros(C)
    x[5] = 1.0
    one = encode_update_tensor(x, SPARSE)  # 1 value: a 12-bit offset padded to 16, 1 code in 8
    broken = one.clone()
    broken[7] |= 0x10
    _bad(broken, C, "padding bits after the last offset")
    broken = one.clone()
    broken[8] |= 0x40
    _bad(broken, C, "padding bits after the last code")
    res = encode_update_tensor(x, RESULT).clone()
    res[-1] = 128
    _bad(res, C, "value 0 is -128", RESULT)


def test_nonfinite_input_travels_as_a_scale_that_every_receiver_rejects() -> None:
    for codec in (SPARSE, RESULT):
        x = _sample(C + 100)
        x[C + 3] = math.nan
        _bad(encode_update_tensor(x, codec), x.numel(), "scale of chunk 1 is nan", codec)
        x[C + 3] = math.inf
        _bad(encode_update_tensor(x, codec), x.numel(), "scale of chunk 1 is inf", codec)


def test_dense_quotas_mark_values_in_a_bitmap() -> None:
    # 1.5 bytes per offset passes a 512-byte bitmap above K = 341
    n = C + 1000
    x = _sample(n, seed=4)
    small = encode_update_tensor(x, "sparse-topk:341")
    big = encode_update_tensor(x, "sparse-topk:342")
    assert small.numel() == 12 + (3 * (341 + 84) + 1) // 2 + (341 + 84 + 3) // 4
    assert big.numel() == 12 + 2 * 512 + (342 + 84 + 3) // 4
    back = _decode(big, n, "sparse-topk:342")
    assert int((back != 0).sum()) == 342 + 84
    # the bitmap of chunk 0 at bytes 12..523: bit o of byte o // 8 marks offset o
    marks = [o for o in range(C) if (int(big[12 + o // 8]) >> (o % 8)) & 1]
    assert marks == back[:C].nonzero().reshape(-1).tolist()


def test_a_bitmap_that_disagrees_with_its_count_or_marks_past_the_chunk_is_refused() -> None:
    n = C + 1000
    codec = "sparse-topk:342"
    good = encode_update_tensor(_sample(n, seed=4), codec)
    first = next(o for o in range(C) if not (int(good[12 + o // 8]) >> (o % 8)) & 1)
    broken = good.clone()
    broken[12 + first // 8] |= 1 << (first % 8)
    _bad(broken, n, "bitmap of chunk 0 marks 343 values, its count says 342", codec)
    # chunk 1 holds 1000 values: mark offset 2000 and drop its count's last value
    broken = good.clone()
    last = max(o for o in range(1000) if (int(good[12 + 512 + o // 8]) >> (o % 8)) & 1)
    broken[12 + 512 + last // 8] &= 255 - (1 << (last % 8))
    broken[12 + 512 + 2000 // 8] |= 1 << (2000 % 8)
    _bad(broken, n, "offset 2000 of value .* out of range: chunk 1 has 1000 values", codec)
