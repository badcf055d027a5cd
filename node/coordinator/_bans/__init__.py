"""The ban book and the evidence rules: majority and confirmed bans, what a reputation replay
reads, how a partition recomputation is judged, their verdicts. Pure logic over the store's
typed rows, like ``_rounds/``. See specs/coordinator.md#bans. Private to
``cnode.node.coordinator``."""
