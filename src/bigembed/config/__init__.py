"""The job config: schema, loading (YAML/TOML/JSON/PBG Python), value types, PBG's key table.

* :mod:`~bigembed.config.schema`: :class:`ConfigSchema`, the whole config;
  :mod:`~bigembed.config.sections` its nested sections; :mod:`~bigembed.config.types` the value
  types; :mod:`~bigembed.config.checks` the cross-field checks and warnings;
* :mod:`~bigembed.config.loading`: file to validated config (:mod:`~bigembed.config.files`,
  :mod:`~bigembed.config.keys`, :mod:`~bigembed.config.overrides`,
  :mod:`~bigembed.config.validation_errors`); :mod:`~bigembed.config.cli_args` the command-line
  arguments;
* :mod:`~bigembed.config.pbg_keys`: how keys compare with PBG's;
  :mod:`~bigembed.config.key_listing` the ``bigembed config keys`` table;
* :mod:`~bigembed.config.to_model`: the model's part of the config.
"""

from bigembed.config.checks import config_warnings
from bigembed.config.cli_args import add_config_arguments, config_from_args
from bigembed.config.files import read_config_file
from bigembed.config.key_listing import config_keys, format_config_keys
from bigembed.config.keys import normalize_keys
from bigembed.config.loading import config_to_dict, load_config, parse_config_dict
from bigembed.config.overrides import apply_overrides
from bigembed.config.pbg_keys import BIGEMBED_ONLY_KEYS, IGNORED_KEYS, PBG_DIFFERENCES, pbg_status
from bigembed.config.schema import ConfigSchema
from bigembed.config.sections import (
    EarlyStoppingSchema,
    EntitySchema,
    RelationSchema,
    TuneParamSchema,
    TuneSchema,
)
from bigembed.config.to_model import model_spec, relation_list
from bigembed.config.types import PRECISION_NAMES, STRATEGY_NAMES, OneOf

__all__ = [
    "BIGEMBED_ONLY_KEYS",
    "IGNORED_KEYS",
    "PBG_DIFFERENCES",
    "PRECISION_NAMES",
    "STRATEGY_NAMES",
    "ConfigSchema",
    "EarlyStoppingSchema",
    "EntitySchema",
    "OneOf",
    "RelationSchema",
    "TuneParamSchema",
    "TuneSchema",
    "add_config_arguments",
    "apply_overrides",
    "config_from_args",
    "config_keys",
    "config_to_dict",
    "config_warnings",
    "format_config_keys",
    "load_config",
    "model_spec",
    "normalize_keys",
    "parse_config_dict",
    "pbg_status",
    "read_config_file",
    "relation_list",
]
