"""cnode.node.hub: checkpoints on a Hugging Face Hub repo, uploaded and downloaded verified.

See specs/training.md#hugging-face-fallback. Errors: ``_exceptions.py``.
"""

from . import limits as limits
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
    "limits",
    "load_hub_login",
    "upload_checkpoint",
]
