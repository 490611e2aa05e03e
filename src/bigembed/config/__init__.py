"""The job config: schema, loading (YAML/TOML/JSON/PBG Python), value types, PBG's key table.

* :mod:`~bigembed.config.schema`: :class:`ConfigSchema`, the whole config;
  :mod:`~bigembed.config.sections` its nested sections; :mod:`~bigembed.config.types` the value
  types; :mod:`~bigembed.config.checks` the cross-field checks and warnings;
* :mod:`~bigembed.config.loading`: file to validated config (:mod:`~bigembed.config.files`,
  :mod:`~bigembed.config.keys`, :mod:`~bigembed.config.overrides`,
  :mod:`~bigembed.config.validation_errors`); :mod:`~bigembed.config.cli_args` the command-line
  arguments;
* :mod:`~bigembed.config.pbg_keys`: how keys compare with PBG's;
  :mod:`~bigembed.config.key_listing` the ``bigembed config keys`` table,
  :mod:`~bigembed.config.key_help` one key in full;
* :mod:`~bigembed.config.to_model`: the model's part of the config.
"""

import lazy_loader

# What other packages may use: listed in __init__.pyi, imported on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
