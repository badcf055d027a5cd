"""node/coordinator/_config.py: the run config's ``gateways`` (specs/gateway.md, training.md)."""

from __future__ import annotations

import pytest

from cnode.node.coordinator import RunConfig, RunConfigError


def test_gateways_are_optional_and_absent_from_the_dict_when_empty() -> None:
    config = RunConfig.from_dict({"run": "r"})
    assert config.gateways == [] and "gateways" not in config.to_dict()
    assert "gateways" not in config.public_dict()  # signed states of such runs are unchanged


def test_gateways_round_trip() -> None:
    urls = ["https://trustless-gateway.link", "http://127.0.0.1:8080"]
    config = RunConfig.from_dict({"run": "r", "gateways": urls})
    assert config.gateways == urls and config.public_dict()["gateways"] == urls
    assert RunConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("gateways", "message"),
    [
        (["ftp://x"], "not an http"),
        (["http://"], "not an http"),
        (["https://gw?x=1"], "not an http"),
        ([f"https://g{i}" for i in range(17)], "at most 16"),
        ("https://one", "must be list"),
    ],
)
def test_bad_gateways_are_refused(gateways: object, message: str) -> None:
    with pytest.raises(RunConfigError, match=message):
        RunConfig.from_dict({"run": "r", "gateways": gateways})
