"""A seeded, bounded fuzz of the trustless gateway's routes (issue 29): random and extreme CIDs,
sub-paths, query parameters, Accept headers and methods. Every answer is a 2xx/3xx, or a refusal
with a one-line text (4xx, or the spec's 501 for content paths); never a 500; the gateway keeps
serving. ``CNODE_FUZZ_SEED`` replays a run (default 29; 300 cases, about a second)."""

from __future__ import annotations

import os
import random
from collections import Counter
from urllib.parse import quote

import httpx
import torch

from cnode.storage import BlockStore, CheckpointMeta, compute_cid, save_checkpoint
from tests.support.http import gateway_thread

SEED = int(os.environ.get("CNODE_FUZZ_SEED", "29"))
CASES = 300
TEXTS = ["", "x", "bafkqaaa", "Qm", "\u0663", "%00", "🙂" * 50, "9" * 400, "-1", "..", "a/b"]
ACCEPTS = [
    None,
    "",
    "*/*",
    "application/vnd.ipld.raw",
    "application/vnd.ipld.car",
    "application/vnd.ipld.car; version=2",
    "application/vnd.ipld.car; order=xyz; dups=maybe",
    "application/vnd.ipld.car;q=0, application/vnd.ipld.raw;q=0.0",
    "text/html",
    ";;;,,,=",
    "application/vnd.ipld.car; version=" + "1" * 2000,
]
QUERY = {
    "format": ["raw", "car", "", "tar", "RAW", "\u0663"],
    "dag-scope": ["block", "entity", "all", "", "none", "x" * 300],
    "car-version": ["1", "2", "", "-1", str(2**63)],
    "car-order": ["dfs", "unk", "bfs", ""],
    "car-dups": ["y", "n", "maybe", ""],
    "entity-bytes": ["0:10", "-1:*", str(2**64)],
    "filename": ["x", "../../etc"],
}


def test_fuzz_gateway_routes(tmp_path: object) -> None:
    store = BlockStore(tmp_path / "blocks")  # type: ignore[operator]
    meta = CheckpointMeta(run_id="fz", model_config={"model_type": "gpt2"}, tokenizer_files={})
    root = save_checkpoint(store, {"w": torch.randn(1000)}, meta)
    cids = [str(root), str(compute_cid(b"not held")), str(compute_cid(b"x", 0x71))]
    rng = random.Random(SEED)
    statuses: Counter[int] = Counter()
    with gateway_thread(store) as gateway, httpx.Client(base_url=gateway.url, timeout=30) as c:
        for _ in range(CASES):
            cid = rng.choice(cids * 4 + [quote(t, safe="") or "x" for t in TEXTS])
            cid = cid[: rng.choice([len(cid), max(1, len(cid) - 3)])]  # truncated CIDs too
            sub = rng.choice(["", "", "/a", "/" + quote(rng.choice(TEXTS), safe="")])
            params = {k: rng.choice(v) for k, v in QUERY.items() if rng.random() < 0.12}
            accept = rng.choice(ACCEPTS + ACCEPTS[3:5] * 4)
            headers = {} if accept is None else {"Accept": accept}
            if rng.random() < 0.1:
                headers["If-None-Match"] = rng.choice(['"x"', "*", f'"{root}.raw"'])
            method = rng.choice(["GET"] * 6 + ["HEAD"] * 2 + ["POST", "DELETE"])
            r = c.request(method, f"/ipfs/{cid}{sub}", params=params, headers=headers)
            statuses[r.status_code] += 1
            assert r.status_code != 500 and (r.status_code < 500 or r.status_code == 501), (
                f"seed {SEED}: {method} {r.request.url} {headers} -> {r.status_code} {r.text[:200]}"
            )
            if r.status_code >= 400 and method != "HEAD":
                assert r.text.strip(), f"{r.request.url}: a refusal without a reason"
        assert c.get(f"/ipfs/{root}?format=raw").status_code == 200  # still serving
    print(f"gateway fuzz seed {SEED}: {CASES} cases; statuses {dict(sorted(statuses.items()))}")
    assert len(statuses) >= 4, statuses
