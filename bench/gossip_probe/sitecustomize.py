"""Counts what a node's gossipsub router sends, for ``bench/swarm_size.py --count-gossip``.

Python imports ``sitecustomize`` at start from the first folder on ``sys.path`` that has one; the
bench puts this folder on the nodes' ``PYTHONPATH`` and names an output folder in
``CNODE_GOSSIP_PROBE_DIR``. Nothing else runs with it. It wraps py-libp2p's ``Pubsub.write_msg``
(every RPC a router sends: publishes, forwards and control) and counts, per process, the RPCs and
their bytes, the messages by topic, and the control entries; each process writes its counts to
``<dir>/<pid>.json`` every 100 RPCs and at exit. Every RPC sent is one received, so the sum over
the nodes is the swarm's gossip both ways. The node's own code runs unchanged.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
from pathlib import Path
from typing import Any

_DIR = os.environ.get("CNODE_GOSSIP_PROBE_DIR")
_counts: collections.Counter[str] = collections.Counter()


def _dump() -> None:
    if _DIR and _counts:
        path = Path(_DIR) / f"{os.getpid()}.json"
        path.write_text(json.dumps(dict(_counts)), encoding="utf-8")


def _install() -> None:
    from libp2p.pubsub.pubsub import Pubsub

    send = Pubsub.write_msg

    async def write_msg(self: Any, stream: Any, rpc: Any) -> bool:
        for msg in rpc.publish:
            _counts["messages " + ",".join(msg.topicIDs)] += 1
        control = rpc.control
        for kind in ("ihave", "iwant", "graft", "prune"):
            _counts[kind] += len(getattr(control, kind))
        _counts["rpcs"] += 1
        _counts["bytes"] += rpc.ByteSize()
        if _counts["rpcs"] % 100 == 0:
            _dump()
        return await send(self, stream, rpc)

    Pubsub.write_msg = write_msg  # type: ignore[method-assign]
    atexit.register(_dump)


if _DIR:
    _install()
