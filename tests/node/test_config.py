"""config.toml: defaults, round trip, and clear errors for bad values."""

from pathlib import Path

import pytest

from cnode.node import ConfigError
from cnode.node._config import NodeConfig, load_config, save_config


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path) == NodeConfig()


def test_round_trip(tmp_path: Path) -> None:
    config = NodeConfig(bootstrap=["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWabc"], log_format="json")
    save_config(tmp_path, config)
    assert load_config(tmp_path) == config


def test_relative_storage_path_is_under_home(tmp_path: Path) -> None:
    assert NodeConfig().blocks_dir(tmp_path) == tmp_path / "blocks"
    assert NodeConfig(storage_path="/srv/blocks").blocks_dir(tmp_path) == Path("/srv/blocks")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("listen = [", "cannot read"),
        ("colour = 'blue'", "unknown setting(s) colour"),
        ("upload_rate_bytes_per_s = 'fast'", "upload_rate_bytes_per_s must be an integer"),
        ("upload_rate_bytes_per_s = -1", "must be >= 0"),
        ("log_format = 'xml'", "log_format must be one of"),
    ],
)
def test_bad_config_is_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(tmp_path)
