"""A trained model answering queries: ``bigembed.load``, predict, similar, nearest neighbours."""

from bigembed.serving.query import example_predictions, load

__all__ = ["example_predictions", "load"]
