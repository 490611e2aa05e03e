"""Everything that ranks and measures: sampled ranking, full filtered ranking, the metrics.

One implementation per protocol, used by ``train`` (the withheld-edge eval), ``eval`` and
``serving``:

* :mod:`~bigembed.ranking.sampled`: a bucket's edges against the sampled negatives training
  uses (PBG's ``eval_fraction`` and ``torchbiggraph_eval``), cut into independent units that
  Hogwild workers can run;
* :mod:`~bigembed.ranking.full`: every edge against all entities of its side's type, raw and
  filtered;
* :mod:`~bigembed.ranking.directions`: how a trained model scores one side of an edge (anchors
  and candidates);
* :mod:`~bigembed.ranking.filters`: the known true edges that filtered ranking leaves out;
* :mod:`~bigembed.ranking.metrics`: ranks from scores, and MR, MRR, Hits@k, AUC.

Training's native kernel (:mod:`bigembed.kernels.native.eval`, a layer above) plugs into
:func:`~bigembed.ranking.sampled.eval_unit` as a ``SideScorer``; the eager path here is the
reference it must agree with.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
