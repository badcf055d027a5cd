"""Bans and the evidence behind them: the ban book, the coordinator's own checks of a reputation
report and of a wrong partition result, their slots and verdicts. See specs/coordinator.md#bans.
Private to ``cnode.node.coordinator``."""
