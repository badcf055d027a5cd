"""CPU cost of gossip between two cnode nodes with and without defects 21-24 of py-libp2p 0.8.1
(specs/announce.md, ``node/p2p/_defects/_rpc.py``).

Two real nodes (``open_p2p_node``: Noise, yamux, gossipsub, every defect mended as in a run) in
one process, one publishing MESSAGES sealed announcements to the other through
``P2PNode.publish`` (paced at PUBLISH_MAX_PER_S) and the other opening them with the node's
validator. The baseline puts py-libp2p's own four functions back (``__wrapped__``) before the
nodes connect. Each variant runs in a fresh child process; the figure is the child's CPU
seconds per 1,000 messages delivered, both nodes together, and the ratio mended / library is
measured in the same run.

    flock /tmp/cnode-heavy.lock nice -n 5 .venv/bin/python bench/pubsub_rpc_cost.py [MESSAGES]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOPIC = "/cnode-bench/rpc-cost"


def _library_functions() -> None:
    """Put back py-libp2p's own code where defects 21-24 replaced it (process-wide)."""
    from libp2p.pubsub import floodsub, gossipsub, pubsub, utils
    from libp2p.stream_muxer.yamux.yamux import YamuxStream

    check = utils.maybe_consume_signed_record.__wrapped__  # type: ignore[attr-defined]
    for module in (utils, pubsub, gossipsub, floodsub):
        module.maybe_consume_signed_record = check  # type: ignore[attr-defined]
    build = pubsub.env_to_send_in_RPC.__wrapped__  # type: ignore[attr-defined]
    for module in (pubsub, gossipsub, floodsub):
        module.env_to_send_in_RPC = build  # type: ignore[attr-defined]
    from libp2p.utils import varint

    pubsub.read_varint_prefixed_bytes_limited = varint.read_varint_prefixed_bytes_limited  # type: ignore[attr-defined]
    tune = YamuxStream._auto_tune_and_send_window_update.__wrapped__  # type: ignore[attr-defined]
    YamuxStream._auto_tune_and_send_window_update = tune  # type: ignore[method-assign]


async def _run(messages: int, mended: bool) -> float:
    import trio

    from cnode.auth import Identity, seal
    from cnode.node.p2p import (
        ANNOUNCE_PAYLOAD_TYPE,
        EnvelopeValidator,
        P2PSettings,
        limits,
        open_p2p_node,
    )
    from cnode.storage import BlockStore

    validator = EnvelopeValidator(ANNOUNCE_PAYLOAD_TYPE, allow=lambda _peer: True)
    ida, idb = Identity.generate(), Identity.generate()
    with tempfile.TemporaryDirectory() as tmp:
        store = BlockStore(Path(tmp) / "blocks")
        async with (
            open_p2p_node(ida, store, P2PSettings(), allow=bool) as a,
            open_p2p_node(idb, store, P2PSettings(), allow=bool) as b,
        ):
            if not mended:
                _library_functions()  # before any pubsub stream opens
            await b.connect(a.listen_addrs[0])
            async with b.subscribe(TOPIC, validator) as sub, a.subscribe(TOPIC, validator):
                await trio.sleep(2)  # the mesh formed; the handshakes stay out of the figure
                got = 0

                async def receive() -> None:
                    nonlocal got
                    async for _opened in sub:
                        got += 1
                        if got == messages:
                            return

                start = time.process_time()
                with trio.fail_after(messages / limits.PUBLISH_MAX_PER_S * 3 + 30):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(receive)
                        for i in range(messages):
                            await a.publish(TOPIC, seal(ida, ANNOUNCE_PAYLOAD_TYPE, {"i": i}))
                return (time.process_time() - start) / messages * 1000


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        import trio

        print(trio.run(_run, int(sys.argv[2]), sys.argv[3] == "mended"))
        return
    messages = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    figures = {}
    for variant in ("library", "mended"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(messages), variant],
            capture_output=True,
            text=True,
            timeout=messages / 50 * 3 + 120,
            check=True,
        )
        figures[variant] = float(out.stdout.strip().splitlines()[-1])
        print(f"{variant:8s} {figures[variant]:.3f} CPU s per 1,000 messages ({messages} sent)")
    print(f"ratio mended / library: {figures['mended'] / figures['library']:.2f}")


if __name__ == "__main__":
    main()
