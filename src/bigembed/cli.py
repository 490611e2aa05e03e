"""The ``bigembed`` command line.

Each subcommand lives in its own module under :mod:`bigembed.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to the function that runs it
(``func(args) -> int``). User errors (:class:`~bigembed.errors.BigembedError`) are printed as
one line and give a non-zero exit status; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence

from bigembed import __version__
from bigembed.errors import BigembedError

# Order here is the order in `bigembed --help`.
COMMAND_MODULES = (
    "demo",
    "import_cmd",
    "config_cmd",
    "train_cmd",
    "eval_cmd",
    "export_cmd",
    "query_cmd",
    "convert_cmd",
    "plot_cmd",
    "dist_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bigembed",
        description="Learn embeddings of huge multi-relation graphs (PyTorch-BigGraph style).",
    )
    parser.add_argument("--version", action="version", version=f"bigembed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        qualified = f"bigembed.commands.{name}"
        if importlib.util.find_spec(qualified) is None:
            continue
        importlib.import_module(qualified).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.func(args) or 0)
    except BigembedError as exc:
        print(f"bigembed {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"bigembed {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bigembed ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
