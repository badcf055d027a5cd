"""Named limits of ``cnode.node.hub``, shared by code, specs/training.md and tests."""

from __future__ import annotations

from cnode.storage import limits as storage_limits

# Bytes of ``cnode-manifest.car`` a download accepts before the manifest is known.
MAX_MANIFEST_CAR_BYTES = storage_limits.MAX_MANIFEST_SIZE + storage_limits.MAX_CAR_HEADER_SIZE
# Bytes of safetensors header on top of the tensors (the JSON header is bounded by storage).
MAX_WEIGHTS_OVERHEAD = storage_limits.MAX_SAFETENSORS_HEADER + 8
