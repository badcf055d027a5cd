"""One file of a Hub repo at one commit, refused before download when the Hub says it is too big.

Shared by the checkpoint download (``_transfer.py``) and the training corpus
(``cnode.node.train``: ``corpus = "hf://datasets/..."``). Blocking, like all of huggingface_hub.
Errors are built from the status code and the Hub's ``X-Error-Message`` only, and re-raised
``from None``: the client's exception text and its request (headers, token) never travel along.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import (
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    try_to_load_from_cache,
)
from huggingface_hub.errors import HfHubHTTPError

from cnode.auth import HF_TRANSPORT_ERRORS, resolve_hf_endpoint

from ._exceptions import HubError, HubUnavailable

__all__ = ["download_file", "hub_errors"]


@contextmanager
def hub_errors(url: str, what: str) -> Iterator[None]:
    """Translate huggingface_hub's and the HTTP library's errors into HubUnavailable."""
    try:
        yield
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        reason = exc.response.headers.get("X-Error-Message", "") if exc.response is not None else ""
        raise HubUnavailable(
            f"the Hub at {url} refused to {what} (HTTP {status}{': ' + reason if reason else ''})"
        ) from None
    except HF_TRANSPORT_ERRORS as exc:
        raise HubUnavailable(
            f"cannot reach the Hub at {url} to {what}: {type(exc).__name__}"
        ) from None


def download_file(
    repo: str,
    filename: str,
    *,
    revision: str,
    max_bytes: int,
    repo_type: str = "model",
    folder: Path | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
) -> Path:
    """Download ``filename`` of ``repo`` (a ``repo_type`` repo) at ``revision``; its local path.

    Asks the Hub for the file's size first (HEAD) and downloads nothing when it is over
    ``max_bytes``. ``folder`` is where the file goes; None means huggingface_hub's cache
    (``$HF_HOME``), where a file of a commit sha already there is used without asking the Hub.
    ``endpoint`` defaults to ``$HF_ENDPOINT``; ``token`` is as huggingface_hub takes it (a token;
    None: the machine's own, ``$HF_TOKEN`` or ``hf auth login``; False: none).

    Raises HubUnavailable (unreachable, or an error status: 404 for an unknown repo, revision or
    file) or HubError (the file is, or came, larger than ``max_bytes``).
    """
    url = resolve_hf_endpoint(endpoint)
    where = f"{filename} of {repo}"
    cached = None
    if folder is None:
        cached = try_to_load_from_cache(repo, filename, revision=revision, repo_type=repo_type)
    if isinstance(cached, str):
        path = cached
    else:
        with hub_errors(url, f"serve {where}@{revision[:12]}"):
            file_url = hf_hub_url(
                repo, filename, repo_type=repo_type, revision=revision, endpoint=url
            )
            meta = get_hf_file_metadata(file_url, token=token, endpoint=url)
            if meta.size is None or meta.size > max_bytes:
                raise HubError(f"{where} is {meta.size} bytes, over the limit of {max_bytes}")
            path = str(
                hf_hub_download(
                    repo,
                    filename,
                    repo_type=repo_type,
                    revision=revision,
                    endpoint=url,
                    local_dir=folder,
                    token=token,
                )
            )
    size = os.path.getsize(path)
    if size > max_bytes:  # a Hub whose HEAD and GET disagree, or a cache changed by hand
        raise HubError(f"{where} is {size} bytes on disk, over the limit of {max_bytes}")
    return Path(path)
