"""cnode.aggregation"""

__all__: list[str] = []
