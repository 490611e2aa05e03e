"""``bigembed config``: show a resolved config, or list every config key.

``bigembed config show CONFIG [-p KEY=VALUE ...] [--format yaml|json]`` validates the config,
applies the overrides and prints it with every default filled in (the exact config a run uses).
``bigembed config keys`` prints every key on one line cut to the terminal's width (default,
``pbg`` column: same / differs / new, the start of its meaning) and, below it, how each
``differs`` key differs from PBG; ``bigembed config keys KEY...`` shows those keys in full (type,
allowed values, default, PBG status, the whole description).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from bigembed.config import (
    add_config_arguments,
    config_from_args,
    config_to_dict,
    format_config_keys,
    format_key_help,
)


def _show(args: argparse.Namespace) -> int:
    data = config_to_dict(config_from_args(args))
    if args.format == "json":
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), end="")
    return 0


def _keys(args: argparse.Namespace) -> int:
    print(format_key_help(args.keys) if args.keys else format_config_keys())
    return 0


def register(subparsers: Any) -> None:
    """Add the ``config`` command and its ``show`` / ``keys`` subcommands."""
    parser = subparsers.add_parser(
        "config",
        help="show a resolved config or list the config keys",
        description="Inspect configurations (PyTorch-BigGraph's keys; YAML, TOML, JSON or "
        "PBG .py).",
    )
    sub = parser.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    sub.required = True

    show = sub.add_parser(
        "show",
        help="print the config with overrides applied and all defaults filled in",
        description="Validate CONFIG, apply -p overrides and print the full resolved config.",
    )
    add_config_arguments(show)
    show.add_argument(
        "--format", choices=("yaml", "json"), default="yaml", help="output format (default: yaml)"
    )
    show.set_defaults(func=_show)

    keys = sub.add_parser(
        "keys",
        help="list the config keys, or show some in full",
        description="Without KEY: every config key on one line (default, how it compares with "
        "PyTorch-BigGraph: pbg column same, differs or new, and the start of its meaning; the "
        "differences are listed after the table and in docs/pbg_compatibility.md). With KEY: "
        "those keys in full (type, allowed values, default, the whole description).",
    )
    keys.add_argument(
        "keys",
        nargs="*",
        metavar="KEY",
        help="a key as listed (relations[i].operator), with an index or name in place of the "
        "placeholder (relations[0].operator, entities.user.num_partitions), or its last part "
        "(operator)",
    )
    keys.set_defaults(func=_keys)
