"""Moving checkpoints between bigembed and other systems (PyTorch-BigGraph), and between two
imports of one entity path (``remap``)."""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
