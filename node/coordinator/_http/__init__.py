"""The coordinator's HTTP side (aiohttp): the server and its handlers, request decoding, rate
limits, metrics, node reports and the dashboard. Private to ``cnode.node.coordinator``."""
