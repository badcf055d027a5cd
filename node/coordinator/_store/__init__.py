"""The coordinator's durable state: the SQLite store and its schema (with the migration of older
databases). Private to ``cnode.node.coordinator``."""
