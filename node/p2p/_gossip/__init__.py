"""Signed announcements on the run's gossip topic and subscriptions to it (specs/announce.md).
Private to ``cnode.node.p2p``."""
