"""Reading edge-list files (TSV/CSV/Parquet, optionally compressed): formats, columns, batches.

Used by the importer (``bigembed import``) and by evaluation of files of names (``bigembed
eval --edges FILE``); it knows nothing of entity stores or checkpoints.
"""
