"""``bigembed import``: edge lists -> an entity store and bucketed edge stores (see storage)."""

from bigembed.importing.importer import ImportOptions, run_import

__all__ = ["ImportOptions", "run_import"]
