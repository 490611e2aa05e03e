from .pbg import from_pbg, to_pbg

__all__ = ["from_pbg", "to_pbg"]
