"""``bigembed build-kernels``: build the native C++ kernel ahead of training, and say where.

Training builds the kernel into the user cache on first use when the machine has a C++
compiler. Building ahead serves machines that cannot: a cluster image, a read-only home, nodes
without a compiler (``--into-package`` puts it beside bigembed's code, where every user of this
installation finds it; ``--into DIR`` anywhere, found through ``BIGEMBED_KERNEL_DIR=DIR``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bigembed.errors import BigembedError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "build-kernels",
        help="build the native C++ training kernel now (needs a C++ compiler: $CXX, else c++)",
        description="Compile the native kernel for this machine and print where it went. "
        "Without an option it goes to the user cache, where training also builds it on first "
        "use. Training looks in $BIGEMBED_KERNEL_DIR, then beside bigembed's code, then in "
        "the user cache.",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--into", metavar="DIR", help="build into DIR (then set BIGEMBED_KERNEL_DIR=DIR)"
    )
    where.add_argument(
        "--into-package",
        action="store_true",
        help="build beside bigembed's code (for a cluster image or a read-only home)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bigembed.kernels import PACKAGE_DIR, NativeUnavailable, build_library, cache_dir

    if args.into_package:
        directory = PACKAGE_DIR
    elif args.into:
        directory = Path(args.into)
    else:
        directory = cache_dir()
    if directory.exists() and not directory.is_dir():
        raise BigembedError(f"--into {directory}: not a directory (nothing was written)")
    try:
        path = build_library(directory)
    except NativeUnavailable as exc:
        raise BigembedError(str(exc)) from None
    print(f"Built the native kernel: {path}")
    if args.into:
        print(f"Training finds it with BIGEMBED_KERNEL_DIR={directory.resolve()}")
    return 0
