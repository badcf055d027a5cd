"""The coordinator's HTTP layer: every handler (signed ops, reads, long polls, evidence, the
dashboard, metrics), the driver that runs the pure rules over the store, rate limits and
evidence slots. The only part of the coordinator that does I/O besides the store. Private to
``cnode.node.coordinator``."""
