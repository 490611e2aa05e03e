from .importer import ImportOptions, run_import

__all__ = ["ImportOptions", "run_import"]
