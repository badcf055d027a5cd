"""cnode: train one neural network together with peers you do not trust.

The distribution maps four top-level folders to subpackages:

* ``cnode.storage``     content-addressed blocks, manifests, CAR and HF-folder import/export
* ``cnode.aggregation`` deterministic, Byzantine-robust aggregation (CenteredClip and friends)
* ``cnode.auth``        keys, peer ids, signed envelopes, access tokens, HF login binding
* ``cnode.node``        everything with network I/O: libp2p host, block exchange, coordinator,
                        training loop and the ``cnode`` command line

Layers go one way: ``storage``, ``aggregation`` and ``auth`` never import ``node``.
"""

from cnode._exceptions import CnodeError as CnodeError

__version__ = "0.1.0"

__all__ = ["CnodeError", "__version__"]
