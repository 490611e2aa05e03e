"""The config on a command line: the positional config file and repeatable ``-p KEY=VALUE``
overrides that every command taking a config shares."""

from __future__ import annotations

import argparse

from bigembed.config.loading import load_config
from bigembed.config.schema import ConfigSchema


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the positional ``config`` and the repeatable ``-p/--param KEY=VALUE``."""
    parser.add_argument("config", help="config file (.yaml, .yml, .toml, .json or PBG .py)")
    parser.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. -p num_epochs=5 -p relations.0.operator=diagonal "
        "-p entities.all.num_partitions=4 -p edge_paths=a,b (repeatable)",
    )


def config_from_args(args: argparse.Namespace) -> ConfigSchema:
    """Load the config named by :func:`add_config_arguments`' arguments."""
    params = getattr(args, "param", None) or []
    flat: list[str] = []
    for item in params:  # tolerate nargs-style lists too
        flat.extend(item if isinstance(item, list) else [item])
    return load_config(args.config, flat)
