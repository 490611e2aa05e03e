"""What a score is: operators, comparators, losses, negatives, the scoring model.

The names and :class:`ModelSpec` import no torch, so that reading a config stays light; the
torch-bound names are imported on first use (PEP 562).
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
