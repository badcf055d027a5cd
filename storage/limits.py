"""Named limits of cnode.storage, shared by code, specs/manifest.md and tests.

Every size or count read from an untrusted source (a peer, a CAR file, a Hugging Face folder) is
checked against one of these before it is used. See specs/manifest.md#limits.
"""

from __future__ import annotations

# The largest block anyone stores or sends (1 MiB). Raw chunks and DAG-CBOR nodes alike.
MAX_BLOCK_SIZE = 1 << 20
# Tensors are cut into fixed slices of this many bytes (the last one may be shorter), so an
# unchanged tensor gives the same chunk CIDs in the next checkpoint.
CHUNK_SIZE = 1 << 20
# A save of many chunks hashes the next ones in HASH_THREADS worker threads (hashlib releases
# the GIL) while the calling thread writes, at most HASH_AHEAD chunks ahead (HASH_AHEAD x
# CHUNK_SIZE of views into the caller's bytes, no copies): BlockStore.put_new_all.
HASH_THREADS = 2
HASH_AHEAD = 8

# CIDs: only CIDv1, only these codecs (raw 0x55, dag-cbor 0x71, dag-pb 0x70 for the UnixFS view),
# only sha2-256 with 32-byte digests.
CID_VERSION = 1
ALLOWED_CODECS = frozenset({0x55, 0x71, 0x70})
ALLOWED_HASHES = frozenset({0x12})
DIGEST_SIZE = 32

# DAG-CBOR: the deepest nesting of arrays/maps accepted in one node.
MAX_CBOR_DEPTH = 32
# DAG-CBOR: the most array/map entries in one node. A node is at most MAX_BLOCK_SIZE and every
# entry takes at least a byte, so this is the bound the block size implies, stated for the
# shared decoder (cnode/_cbor.py); auth, whose envelopes are smaller, sets a lower one.
MAX_CBOR_ITEMS = MAX_BLOCK_SIZE

# Manifest schema version this code writes and the only one it reads.
MANIFEST_VERSION = 1
# Most nodes (root + layer pages + chunk pages) one manifest may span: 256 x 1 MiB = max manifest.
MAX_MANIFEST_NODES = 256
MAX_MANIFEST_SIZE = MAX_MANIFEST_NODES * MAX_BLOCK_SIZE
# Most layers (tensors) in one checkpoint.
MAX_LAYERS = 100_000
# Most dimensions of one tensor, and the largest single dimension.
MAX_DIMS = 8
MAX_DIM_SIZE = 1 << 40
# Longest layer name (bytes of UTF-8; names are ASCII anyway, see specs/manifest.md#layer-names).
MAX_LAYER_NAME_LEN = 512
# Largest single tensor, and largest whole checkpoint (sum of tensor bytes).
MAX_LAYER_BYTES = 1 << 38  # 256 GiB
MAX_TOTAL_BYTES = 1 << 41  # 2 TiB
# A layer whose chunk list is longer than this keeps its chunks in linked chunk pages.
MAX_CHUNKS_PER_NODE = 16_384  # 16384 x ~39 B of CID = ~640 KiB, well under MAX_BLOCK_SIZE
# Tokenizer (and other side) files carried by a manifest: how many, name length, size.
MAX_TOKENIZER_FILES = 32
MAX_FILE_NAME_LEN = 128
MAX_TOKENIZER_FILE_SIZE = 64 << 20
# Aggregation record: most signed update CIDs one round may list.
MAX_AGGREGATION_UPDATES = 10_000
# Short strings in the manifest (run id, kind, aggregator name, dtype).
MAX_SHORT_STRING = 256

# CAR v1: largest header (it holds only the roots) and most roots (cnode CARs have exactly one).
MAX_CAR_HEADER_SIZE = 64 << 10
MAX_CAR_ROOTS = 1
# A CAR section is a CID (at most 4 varint bytes + 2 + 32) plus one block.
MAX_CAR_SECTION_SIZE = MAX_BLOCK_SIZE + 64

# Hugging Face folders: largest safetensors JSON header and config.json we read.
MAX_SAFETENSORS_HEADER = 16 << 20
MAX_CONFIG_JSON_SIZE = 1 << 20

# UnixFS view (specs/manifest.md#unixfs-view): most links per DAG-PB file node (kubo's default).
UNIXFS_FANOUT = 174

# Durability of fetched blocks (specs/blocks.md#durability): block files written up to this
# many seconds before a stale unsynced-batch marker are checked too (coarse file clocks).
UNSYNCED_MTIME_SLACK_S = 2
