"""The run's rounds: the state machine, the rules of partitioned rounds, the signed views built from
the store, and long polls waiting on rounds. Private to ``cnode.node.coordinator``."""
