"""cnode.storage: content-addressed blocks, checkpoint manifests, CAR and HF-folder export.

Knows nothing of the network. Formats: specs/manifest.md. Errors: ``_exceptions.py``.
"""

from . import limits as limits
from ._blockstore import BlockStore as BlockStore
from ._car import export_car as export_car
from ._car import import_car as import_car
from ._car import verify_car as verify_car
from ._checkpoint import CheckpointInfo as CheckpointInfo
from ._checkpoint import list_checkpoints as list_checkpoints
from ._checkpoint import load_checkpoint as load_checkpoint
from ._checkpoint import load_layer as load_layer
from ._checkpoint import read_file as read_file
from ._checkpoint import read_manifest as read_manifest
from ._checkpoint import read_tokenizer_files as read_tokenizer_files
from ._checkpoint import save_checkpoint as save_checkpoint
from ._checkpoint import tensor_layer as tensor_layer
from ._cid import CID as CID
from ._cid import DAG_CBOR as DAG_CBOR
from ._cid import DAG_PB as DAG_PB
from ._cid import RAW as RAW
from ._cid import compute_cid as compute_cid
from ._cid import verify_block as verify_block
from ._closure import ClosureWalk as ClosureWalk
from ._closure import manifest_closure as manifest_closure
from ._closure import missing_blocks as missing_blocks
from ._dag import block_links as block_links
from ._dag import car_header as car_header
from ._dag import car_section as car_section
from ._dag import is_unixfs_file as is_unixfs_file
from ._dag import read_car as read_car
from ._encode import ManifestLayout as ManifestLayout
from ._exceptions import BlockMismatchError as BlockMismatchError
from ._exceptions import BlockNotFoundError as BlockNotFoundError
from ._exceptions import BlockTooLargeError as BlockTooLargeError
from ._exceptions import CARError as CARError
from ._exceptions import CBORDecodeError as CBORDecodeError
from ._exceptions import CheckpointError as CheckpointError
from ._exceptions import CorruptBlockError as CorruptBlockError
from ._exceptions import HFFolderError as HFFolderError
from ._exceptions import InvalidCIDError as InvalidCIDError
from ._exceptions import ManifestError as ManifestError
from ._exceptions import NonCanonicalCBORError as NonCanonicalCBORError
from ._exceptions import StorageError as StorageError
from ._hf import MANIFEST_CAR as HF_MANIFEST_CAR
from ._hf import export_hf as export_hf
from ._hf import import_hf as import_hf
from ._hf import import_hf_verified as import_hf_verified
from ._hf import read_hf_manifest as read_hf_manifest
from ._manifest import DTYPES as DTYPES
from ._manifest import AggregationRecord as AggregationRecord
from ._manifest import CheckpointMeta as CheckpointMeta
from ._manifest import FileRef as FileRef
from ._manifest import Layer as Layer
from ._manifest import Manifest as Manifest
from ._state import state_cid_of_layers as state_cid_of_layers
from ._unixfs import UnixFSView as UnixFSView
from ._unixfs import recorded_root as recorded_unixfs_root
from ._unixfs import unixfs_view as unixfs_view
from ._unsynced import UnsyncedBatch as UnsyncedBatch
from ._verified import VerifiedBlock as VerifiedBlock
from ._verified import verify_received as verify_received
from ._verify import Fault as Fault
from ._verify import VerifyReport as VerifyReport
from ._verify import verify_checkpoint as verify_checkpoint

__all__ = [  # noqa: RUF022 (plain sorted(), checked by tests/storage/test_exports.py)
    "AggregationRecord",
    "BlockMismatchError",
    "BlockNotFoundError",
    "BlockStore",
    "BlockTooLargeError",
    "CARError",
    "CBORDecodeError",
    "CID",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointMeta",
    "ClosureWalk",
    "CorruptBlockError",
    "DAG_CBOR",
    "DAG_PB",
    "DTYPES",
    "Fault",
    "FileRef",
    "HFFolderError",
    "HF_MANIFEST_CAR",
    "InvalidCIDError",
    "Layer",
    "Manifest",
    "ManifestError",
    "ManifestLayout",
    "NonCanonicalCBORError",
    "RAW",
    "StorageError",
    "UnixFSView",
    "UnsyncedBatch",
    "VerifiedBlock",
    "VerifyReport",
    "block_links",
    "car_header",
    "car_section",
    "compute_cid",
    "export_car",
    "export_hf",
    "import_car",
    "import_hf",
    "import_hf_verified",
    "is_unixfs_file",
    "limits",
    "list_checkpoints",
    "load_checkpoint",
    "load_layer",
    "manifest_closure",
    "missing_blocks",
    "read_car",
    "read_file",
    "read_hf_manifest",
    "read_manifest",
    "read_tokenizer_files",
    "recorded_unixfs_root",
    "save_checkpoint",
    "state_cid_of_layers",
    "tensor_layer",
    "unixfs_view",
    "verify_block",
    "verify_car",
    "verify_checkpoint",
    "verify_received",
]
