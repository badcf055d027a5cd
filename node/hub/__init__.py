"""cnode.node.hub: checkpoints on a Hugging Face Hub repo, uploaded and downloaded verified.

Also :func:`download_file`, the bounded download of one file at one commit that the checkpoint
download and a Hub training corpus share. See specs/training.md#hugging-face-fallback. Errors:
``_exceptions.py``.
"""

from . import limits as limits
from ._download import download_file as download_file
from ._download import hub_errors as hub_errors
from ._exceptions import HubError as HubError
from ._exceptions import HubLoginError as HubLoginError
from ._exceptions import HubUnavailable as HubUnavailable
from ._transfer import HubLogin as HubLogin
from ._transfer import HubRevision as HubRevision
from ._transfer import download_checkpoint as download_checkpoint
from ._transfer import load_hub_login as load_hub_login
from ._transfer import upload_checkpoint as upload_checkpoint

__all__ = [
    "HubError",
    "HubLogin",
    "HubLoginError",
    "HubRevision",
    "HubUnavailable",
    "download_checkpoint",
    "download_file",
    "hub_errors",
    "limits",
    "load_hub_login",
    "upload_checkpoint",
]
