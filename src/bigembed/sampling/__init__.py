"""Splitting work across synchronous replicas so that each gets the same cost.

* :mod:`~bigembed.sampling.load_balancing`: Bagua's load-balancing sampler
  (:class:`LoadBalancingDistributedSampler`, a ``torch.utils.data.Sampler``), its vectorized
  core :func:`balanced_split` (one share per replica from per-item costs, for millions of items)
  and the even split it is compared with (:func:`even_split`).

It imports torch only, and sits low in the layers so that data-parallel training
(``train``, ``distributed``) and distributed evaluation (``eval``) split their edges the same way.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
