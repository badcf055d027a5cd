"""cnode.auth"""

__all__: list[str] = []
