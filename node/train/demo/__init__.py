"""``cnode demo``: a whole swarm on this machine and its closing report.

The names other parts of ``cnode.node.train`` use; the modules stay private.
"""

from __future__ import annotations

from ._run import DemoSettings as DemoSettings
from ._run import run_demo as run_demo
