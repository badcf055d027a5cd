"""The run's rules: the state machine, its transitions, the rules and clock of partitioned
rounds, the signed views. Pure logic over the store's typed rows (no SQL, no HTTP, no clock):
each rule reads facts and returns writes. Private to ``cnode.node.coordinator``."""
