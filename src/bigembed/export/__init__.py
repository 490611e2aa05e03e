"""Export a checkpoint's embeddings and relation parameters: TSV, NumPy, Parquet, Projector.

    bigembed export work/fb15k237/model --format parquet --output fb15k237_parquet

Entity vectors are exported as the model scores with them: the stored row (renormalised to
``max_norm`` if the config sets it) plus the type's global embedding when the model has one
(PBG's exporter adds the global embedding too). Names come from the entity store: the
checkpoint config's ``entity_path`` unless overridden. The output directory is built under a
temporary name and appears only when complete; an existing one is replaced only with ``force``
and only if it is an earlier export (it carries bigembed's marker file, see
:mod:`bigembed.output_paths`); an output that is, holds or lies inside the checkpoint or the
entity store is refused.
See :mod:`bigembed.export.writers` for the files of each format.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
