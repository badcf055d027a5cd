"""``python -m cnode`` runs the command line."""

from cnode.node.cli import run

run()
