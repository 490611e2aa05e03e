from .dependents import live_dependents
from .importer import ImportOptions, run_import

__all__ = ["ImportOptions", "live_dependents", "run_import"]
