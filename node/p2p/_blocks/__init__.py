"""``/cnode/blocks/1.0.0`` and ``/cnode/admit/1.0.0``, both sides: the frames, one request, the
serving handler, admission, and the stream adapter (specs/blocks.md). Private to
``cnode.node.p2p``."""
