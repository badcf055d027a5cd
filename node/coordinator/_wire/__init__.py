"""The coordinator's wire vocabulary, shared by its server and its clients: the signed messages
(``_protocol``), the fields they are read with, partitioned results, ban records, admin actions and
bounded JSON. See specs/coordinator.md#messages. Private to ``cnode.node.coordinator``."""
