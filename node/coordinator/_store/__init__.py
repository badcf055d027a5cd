"""The coordinator's store: the only code that speaks SQL. Typed rows and facts out, typed
writes in, one transaction per request. Private to ``cnode.node.coordinator``."""
