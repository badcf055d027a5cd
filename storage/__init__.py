"""cnode.storage"""

__all__: list[str] = []
