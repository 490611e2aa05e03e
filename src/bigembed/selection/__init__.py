"""Model selection over trainings: early stopping and hyperparameter search.

* :mod:`~bigembed.selection.early_stopping`: validation eval every few epochs, the best version
  kept in ``checkpoint_path/best/``, training stopped after ``patience`` evaluations without
  gain; :func:`train_model` is training with it (what ``bigembed train`` runs);
* :mod:`~bigembed.selection.tuning`: ``bigembed tune``, an Optuna study whose trials are
  ordinary trainings pruned on their validation curve.

This package sits above ``train`` and ``eval`` (which may not import each other) and composes
them.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
