"""The clients of the coordinator API: the async one for nodes, the blocking one for the CLI, and
the core both share. Private to ``cnode.node.coordinator``."""
