"""How a new run's updates travel: the ``[training]`` keys ``cnode coordinator new-run`` and
``cnode demo`` write (specs/training.md#update-codecs).

A codec comes with the settings it was measured with (``bench/codec_loss.py --rounds 64``,
docs/benchmarks.md, issue 38): a run that picks ``sparse-topk`` gets its error-feedback decay
and outer learning rate too, unless its run config says otherwise. Torch-free, so the CLI reads
it before anything heavy is imported. ``TrainingConfig``'s own defaults stay what a table
without the keys has always meant (f32, decay 1, outer lr 1): old runs replay as made.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NEW_RUN_CODEC", "new_run_training"]  # the package exports new_run_training

# The codec of a new run: sparse-topk at density 1/64 (K = 64 of every 4096 values, 2 bits
# each, 12-bit offsets) is 0.0074x an f32 update of the 10.2M model, manifest included
# (int8-blockwise: 0.25x). Over 64 rounds its held-out loss ends within 2 % of f32's
# (docs/benchmarks.md, issue 38), where over 8 it is 16 % behind: each round sends 1/64 of the
# coordinates, so a run needs tens of rounds before error feedback has carried them all.
NEW_RUN_CODEC = "sparse-topk"
# What each codec is run with (keys of TrainingConfig), measured with bench/codec_loss.py
# --rounds 64. sparse-topk: SparseLoCo's decayed error feedback, 0.95 (round 64: -1.2 % against
# f32; decay 1: -0.4 %, behind 0.95 in all but 2 of rounds 23-64); outer lr 1, SparseLoCo's
# (3 was ahead until round 16 and 4.3 % behind f32 at round 64); density 1/64, the most
# that stays under 0.008x f32 with 12-bit offsets (70/4096 would be 0.0080x).
CODEC_SETTINGS: dict[str, dict[str, Any]] = {
    "sparse-topk": {"error_decay": 0.95},
}


def new_run_training(codec: str = NEW_RUN_CODEC) -> dict[str, Any]:
    """The ``[training]`` keys of a new run whose updates travel as ``codec``."""
    return {"update_codec": codec, **CODEC_SETTINGS.get(codec, {})}
