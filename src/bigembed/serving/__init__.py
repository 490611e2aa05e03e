"""A trained model answering queries: ``bigembed.load``, predict, similar, nearest neighbours."""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
