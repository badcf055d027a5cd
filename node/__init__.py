"""Everything with network I/O: libp2p host, block exchange, coordinator, training, CLI.

The only cnode package that touches the network; it depends on ``storage``, ``aggregation`` and
``auth``, which never depend on it.
"""

__all__: list[str] = []
