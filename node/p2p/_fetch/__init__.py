"""Fetching from many holders: the scheduler, the types it works with, the minimum useful rate of a
source, and gateway holders (specs/blocks.md#fetching). Private to ``cnode.node.p2p``."""
