"""Everything with network I/O: libp2p host, block exchange, coordinator, training, CLI.

The only cnode package that touches the network; it depends on ``storage``, ``aggregation`` and
``auth``, which never depend on it. Errors: ``_exceptions.py`` draws the tree; every node
package's root error derives from :class:`NodeError`.
"""

from ._exceptions import ConfigError as ConfigError
from ._exceptions import InitError as InitError
from ._exceptions import NodeError as NodeError
from ._exceptions import UsageError as UsageError
from ._new_run import new_run_training as new_run_training

__all__ = [
    "ConfigError",
    "InitError",
    "NodeError",
    "UsageError",
    "new_run_training",
]
