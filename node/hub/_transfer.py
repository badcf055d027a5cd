"""Checkpoints on a Hugging Face Hub repo: upload (a checkpointer), verified download (a joiner).

The seeds' HF path, kept as a fallback and an archive: a checkpointer started with ``--hf-repo``
uploads each checkpoint as a Hugging Face model folder (``transformers`` loads it as it is) and
tells the coordinator the repo and the commit; a joiner that no peer serves downloads that commit
and rebuilds the checkpoint with :func:`cnode.storage.import_hf_verified`, which checks every
1 MiB slice against the manifest CID the coordinator signed. The Hub is trusted for nothing but
availability. See specs/training.md#hugging-face-fallback.

Everything here blocks (huggingface_hub is synchronous): call it from a worker thread. The Hub
token is passed to huggingface_hub only; every error is re-raised ``from None`` so no chained
request (headers included) travels with it.
"""

from __future__ import annotations

import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import structlog
from huggingface_hub import HfApi

from cnode.auth import resolve_hf_endpoint
from cnode.node._config import HF_BINDING_FILE, HF_TOKEN_FILE
from cnode.storage import (
    CID,
    HF_MANIFEST_CAR,
    BlockStore,
    export_hf,
    import_hf_verified,
    read_hf_manifest,
)

from . import limits
from ._download import download_file, hub_errors
from ._exceptions import HubLoginError

__all__ = ["HubLogin", "HubRevision", "download_checkpoint", "load_hub_login", "upload_checkpoint"]

log = structlog.get_logger(__name__)

_WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class HubLogin:
    """What ``cnode init --hf-login`` stored: the token and the signed peer-id binding."""

    token: str = ""
    binding: bytes = b""

    def __repr__(self) -> str:  # the token must never reach a log line or a traceback
        return f"HubLogin(token=[redacted], binding={len(self.binding)} bytes)"


@dataclass(frozen=True)
class HubRevision:
    """A checkpoint on the Hub: the repo and the commit that holds it."""

    repo: str  # "namespace/name"
    revision: str  # the commit sha (40 hex digits), never a branch: branches move


def load_hub_login(home: Path) -> HubLogin | None:
    """The Hub login stored in ``home``, or None if ``cnode init --hf-login`` was never run.

    Raises HubLoginError when the token file is readable by others than its owner, or empty, or
    the binding is missing (a half-written login).
    """
    token_path, binding_path = Path(home) / HF_TOKEN_FILE, Path(home) / HF_BINDING_FILE
    if not token_path.exists():
        return None
    try:
        mode = token_path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise HubLoginError(
                f"{token_path} is readable by others (mode {stat.S_IMODE(mode):o}); "
                "run: chmod 600 " + str(token_path)
            )
        token = token_path.read_text(encoding="utf-8").strip()
        binding = binding_path.read_bytes()
    except FileNotFoundError:
        raise HubLoginError(f"{binding_path} is missing: run cnode init --hf-login again") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HubLoginError(f"cannot read the Hub login in {home}: {exc}") from None
    if not token:
        raise HubLoginError(f"{token_path} is empty: run cnode init --hf-login again")
    return HubLogin(token, binding)


def upload_checkpoint(
    store: BlockStore,
    manifest: CID,
    *,
    repo: str,
    token: str,
    message: str,
    workdir: Path,
    endpoint: str | None = None,
) -> HubRevision:
    """Upload checkpoint ``manifest`` (all blocks in ``store``) to model repo ``repo``.

    Creates the repo if it does not exist. The folder is written under ``workdir`` first (as big
    as the model) and removed afterwards. Returns the commit that holds it.

    Raises HubUnavailable (unreachable, no write access: the status says which) or a StorageError
    when the checkpoint is not complete in ``store``.
    """
    url = resolve_hf_endpoint(endpoint)
    api = HfApi(endpoint=url, token=token, library_name="cnode")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="hf-upload-") as tmp:
        folder = export_hf(store, manifest, Path(tmp) / "checkpoint")
        with hub_errors(url, f"create or write {repo}"):
            api.create_repo(repo, exist_ok=True)
            info = api.upload_folder(repo_id=repo, folder_path=folder, commit_message=message[:200])
    revision = HubRevision(repo, str(info.oid))
    log.info("hub_uploaded", manifest=str(manifest), repo=repo, revision=revision.revision)
    return revision


def _download(
    url: str, where: HubRevision, filename: str, folder: Path, max_bytes: int, token: str | None
) -> None:
    """Fetch one file of ``where`` into ``folder``, refusing it if the Hub says it is too big."""
    download_file(
        where.repo,
        filename,
        revision=where.revision,
        max_bytes=max_bytes,
        folder=folder,
        endpoint=url,
        token=token or False,
    )


def download_checkpoint(
    store: BlockStore,
    manifest: CID,
    where: HubRevision,
    *,
    workdir: Path,
    endpoint: str | None = None,
    token: str | None = None,
) -> int:
    """Rebuild checkpoint ``manifest`` in ``store`` from the Hub commit ``where``; verified.

    Downloads ``cnode-manifest.car`` first (bounded), learns from the manifest which files to
    fetch and how large each may be, downloads them under ``workdir`` (removed afterwards), and
    imports them with :func:`cnode.storage.import_hf_verified`. Returns the bytes downloaded.

    Raises HubUnavailable / HubError (the Hub failed or offered too much) or
    ``cnode.storage.HFFolderError`` (the Hub served bytes that are not the manifest's).
    """
    url = resolve_hf_endpoint(endpoint)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="hf-download-") as tmp:
        folder = Path(tmp)
        _download(url, where, HF_MANIFEST_CAR, folder, limits.MAX_MANIFEST_CAR_BYTES, token)
        found = read_hf_manifest(store, folder, manifest)
        weights = sum(layer.nbytes for layer in found.layers) + limits.MAX_WEIGHTS_OVERHEAD
        _download(url, where, _WEIGHTS, folder, weights, token)
        for name, ref in found.tokenizer_files.items():
            _download(url, where, name, folder, ref.size, token)
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        import_hf_verified(store, folder, manifest)
    log.info("hub_downloaded", manifest=str(manifest), repo=where.repo, bytes=size)
    return size
