from .checks import config_warnings
from .cli_args import add_config_arguments, config_from_args
from .files import read_config_file
from .held_out import held_out_warnings
from .key_help import format_key_help
from .key_listing import config_keys, format_config_keys
from .keys import normalize_keys
from .loading import config_to_dict, load_config, parse_config_dict
from .overrides import apply_overrides
from .pbg_keys import BIGEMBED_ONLY_KEYS, IGNORED_KEYS, PBG_DIFFERENCES, pbg_status
from .schema import ConfigSchema
from .sections import (
    EarlyStoppingSchema,
    EdgeFilesSchema,
    EntitySchema,
    GrowthSchema,
    RelationSchema,
    TuneParamSchema,
    TuneSchema,
)
from .starter import StarterPaths, starter_config, written_by_init
from .to_model import model_spec, relation_list
from .types import PRECISION_NAMES, PRECISIONS, STRATEGIES, STRATEGY_NAMES, Bytes, OneOf

__all__ = [
    "BIGEMBED_ONLY_KEYS",
    "IGNORED_KEYS",
    "PBG_DIFFERENCES",
    "PRECISIONS",
    "PRECISION_NAMES",
    "STRATEGIES",
    "STRATEGY_NAMES",
    "Bytes",
    "ConfigSchema",
    "EarlyStoppingSchema",
    "EdgeFilesSchema",
    "EntitySchema",
    "GrowthSchema",
    "OneOf",
    "RelationSchema",
    "StarterPaths",
    "TuneParamSchema",
    "TuneSchema",
    "add_config_arguments",
    "apply_overrides",
    "config_from_args",
    "config_keys",
    "config_to_dict",
    "config_warnings",
    "format_config_keys",
    "format_key_help",
    "held_out_warnings",
    "load_config",
    "model_spec",
    "normalize_keys",
    "parse_config_dict",
    "pbg_status",
    "read_config_file",
    "relation_list",
    "starter_config",
    "written_by_init",
]
