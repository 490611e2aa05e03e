from .exporter import FORMATS, entity_blocks, export_checkpoint

__all__ = ["FORMATS", "entity_blocks", "export_checkpoint"]
