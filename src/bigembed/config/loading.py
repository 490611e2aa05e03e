"""Loading a config: file -> raw dict -> ``-p`` overrides -> validated :class:`ConfigSchema`.

Reading each format is :mod:`bigembed.config.files`, key normalisation
:mod:`bigembed.config.keys`, overrides :mod:`bigembed.config.overrides`, error text
:mod:`bigembed.config.validation_errors`. Every failure is a
:class:`~bigembed.errors.ConfigError` whose message starts with the file name (``FILE:`` or
``FILE:LINE:``), then the key path, then what is wrong; accepted settings that deserve a warning
are logged, one line each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bigembed.config.checks import config_warnings
from bigembed.config.files import read_config_file
from bigembed.config.keys import normalize_keys
from bigembed.config.overrides import apply_overrides
from bigembed.config.schema import ConfigSchema
from bigembed.config.validation_errors import format_validation_error
from bigembed.errors import ConfigError

logger = logging.getLogger(__name__)


def parse_config_dict(data: dict[str, Any], source: str = "<config>") -> ConfigSchema:
    """Validate a raw config dict (as read from a file); errors name ``source`` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the config must be a mapping of keys to values, got {type(data).__name__}"
        )
    data = normalize_keys(data, source)
    try:
        cfg = ConfigSchema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, ConfigSchema)) from None
    for line in config_warnings(cfg):
        logger.warning("%s: %s", source, line)
    return cfg


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> ConfigSchema:
    """Read a config file (.yaml/.yml/.toml/.json/.py), apply ``-p`` overrides, validate it."""
    source = os.fspath(path)
    data = read_config_file(Path(source))
    data = normalize_keys(data, source)
    data = apply_overrides(data, overrides, ConfigSchema, source)
    return parse_config_dict(data, source)


def config_to_dict(cfg: ConfigSchema) -> dict[str, Any]:
    """The full config (defaults included) as JSON-safe data; parse_config_dict reverses it."""
    return cfg.model_dump(mode="json")
