from .dependents import PREVIOUS_IMPORTS, live_dependents, previous_import_path
from .importer import ImportOptions, run_import

__all__ = [
    "PREVIOUS_IMPORTS",
    "ImportOptions",
    "live_dependents",
    "previous_import_path",
    "run_import",
]
