from .pbg import from_pbg, to_pbg
from .remap import RemapSummary, default_output, remap_checkpoint

__all__ = ["RemapSummary", "default_output", "from_pbg", "remap_checkpoint", "to_pbg"]
