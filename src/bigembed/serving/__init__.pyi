from .query import example_predictions, load

__all__ = ["example_predictions", "load"]
