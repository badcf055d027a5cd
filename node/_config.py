"""The node's home folder and its ``config.toml``.

``$CNODE_HOME`` (default ``~/.cnode``) holds::

    identity.key        the node's Ed25519 key (mode 0600), see specs/identity.md
    config.toml         the settings below
    hf_token            the Hugging Face token, mode 0600, only after ``cnode init --hf-login``
    hf_binding.cbor     the signed {peer id, HF username, time} binding
    blocks/             the block store (default ``storage_path``)
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import tomli_w

from cnode.node._exceptions import ConfigError

CONFIG_FILE = "config.toml"
IDENTITY_FILE = "identity.key"
HF_TOKEN_FILE = "hf_token"
HF_BINDING_FILE = "hf_binding.cbor"

DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/4001"
DEFAULT_COORDINATOR = "http://127.0.0.1:8470"
LOG_FORMATS = ("console", "json")
NODE_PRECISIONS = ("", "fp32", "bf16-mixed")  # "" = the run's training.precision
_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list of strings"}


def default_home() -> Path:
    """The home folder: ``$CNODE_HOME`` if set, else ``~/.cnode``."""
    env = os.environ.get("CNODE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cnode"


@dataclass(frozen=True)
class NodeConfig:
    """Settings of one node, as stored in ``config.toml``."""

    listen: str = DEFAULT_LISTEN
    bootstrap: list[str] = field(default_factory=list)
    coordinator_url: str = DEFAULT_COORDINATOR
    storage_path: str = "blocks"  # relative paths are relative to the home folder
    log_format: str = "console"
    upload_rate_bytes_per_s: int = 0  # 0 = no cap on serving blocks
    hf_username: str = ""
    # Where `cnode train` runs its local steps: auto | cpu | cuda | cuda:N | mps (--device).
    device: str = "auto"
    # "" = the run's training.precision; "fp32" | "bf16-mixed" overrides it (--precision).
    precision: str = ""

    def blocks_dir(self, home: Path) -> Path:
        path = Path(self.storage_path).expanduser()
        return path if path.is_absolute() else home / path

    def with_changes(self, **changes: object) -> NodeConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


def load_config(home: Path) -> NodeConfig:
    """Read ``home/config.toml``; a missing file gives the defaults."""
    path = home / CONFIG_FILE
    if not path.exists():
        return NodeConfig()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    known = {f for f in NodeConfig.__dataclass_fields__}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    defaults = asdict(NodeConfig())
    for key, value in raw.items():
        if type(value) is not type(defaults[key]):
            raise ConfigError(
                f"{path}: {key} must be {_TYPE_NAMES[type(defaults[key])]}, got {value!r}"
            )
    config = NodeConfig(**raw)
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"{path}: log_format must be one of {LOG_FORMATS}")
    if config.upload_rate_bytes_per_s < 0:
        raise ConfigError(f"{path}: upload_rate_bytes_per_s must be >= 0")
    if config.precision not in NODE_PRECISIONS:
        raise ConfigError(f"{path}: precision must be one of {NODE_PRECISIONS}")
    return config


def save_config(home: Path, config: NodeConfig) -> Path:
    """Write ``home/config.toml`` atomically."""
    path = home / CONFIG_FILE
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(tomli_w.dumps(asdict(config)), encoding="utf-8")
    os.replace(tmp, path)
    return path
