import cnode.aggregation as pkg


def test_all_is_sorted_and_resolves() -> None:
    assert pkg.__all__ == sorted(pkg.__all__)
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None


def test_attack_registry_is_complete() -> None:
    expected = {
        "alie",
        "gaussian",
        "ipm",
        "ipm_large",
        "label_flip",
        "nan",
        "sign_flip",
        "sparse_spike",
        "stale",
    }
    assert set(pkg.ATTACKS) == expected
    assert {"label_flip"} == pkg.ATTACKS_DATA_LEVEL
