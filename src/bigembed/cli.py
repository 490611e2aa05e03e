"""The ``bigembed`` command line.

Each subcommand lives in its own module under :mod:`bigembed.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to the function that runs it
(``func(args) -> int``); :data:`COMMANDS` registers them. User errors
(:class:`~bigembed.errors.BigembedError`) are printed as one line and give a non-zero exit
status. So are the environment's refusals: an ``OSError``
(read-only file system, no permission, disk full, a file where a directory belongs: the message
names the path) and running out of memory (``MemoryError`` or torch's allocator error).
Anything else is a bug and keeps its traceback.

SIGTERM (``kill``, ``timeout``, a batch scheduler's preemption, ``systemctl stop``) ends a
command the way Ctrl-C does: the same clean-up (Hogwild workers stopped, their queues and
semaphores released, nothing half-committed), one line naming the signal, exit status
128 + 15. Without this, Python's default action kills the process on the spot.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from bigembed import __version__
from bigembed.errors import BigembedError
from bigembed.registry import Registry

_CMD = "bigembed.commands"
#: Every command's ``register(subparsers)``, in the order of ``bigembed --help``. A module may
#: register more than its command: ``predict`` adds ``similar``, ``launch`` adds
#: ``partition-server``.
COMMANDS: Registry[Callable[[Any], None]] = Registry(
    "command",
    [
        ("demo", f"{_CMD}.demo:register"),
        ("datasets", f"{_CMD}.datasets_cmd:register"),
        ("init", f"{_CMD}.init_cmd:register"),
        ("split", f"{_CMD}.split_cmd:register"),
        ("import", f"{_CMD}.import_cmd:register"),
        ("config", f"{_CMD}.config_cmd:register"),
        ("train", f"{_CMD}.train_cmd:register"),
        ("tune", f"{_CMD}.tune_cmd:register"),
        ("eval", f"{_CMD}.eval_cmd:register"),
        ("export", f"{_CMD}.export_cmd:register"),
        ("predict", f"{_CMD}.query_cmd:register"),
        ("index", f"{_CMD}.index_cmd:register"),
        ("convert", f"{_CMD}.convert_cmd:register"),
        ("remap", f"{_CMD}.remap_cmd:register"),
        ("plot", f"{_CMD}.plot_cmd:register"),
        ("launch", f"{_CMD}.distributed_cmd:register"),
        ("build-kernels", f"{_CMD}.build_kernels_cmd:register"),
    ],
)


OUT_OF_MEMORY = (
    "out of memory (the dimension, entity counts or batch need more than is available: use "
    "more partitions, a smaller dimension or batch, or check the metadata/config sizes)"
)
_ALLOCATION_MARKERS = ("can't allocate memory", "DefaultCPUAllocator", "out of memory")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def os_error_message(exc: OSError) -> str:
    """One line naming the file(s) and the reason: ``PATH: No space left on device``."""
    reason = exc.strerror or _first_line(exc)
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    if names:
        return f"{' -> '.join(names)}: {reason}"
    return reason


def is_allocation_failure(exc: RuntimeError) -> bool:
    """torch's way of saying "out of memory" (a RuntimeError, not a MemoryError)."""
    text = str(exc)
    return any(marker in text for marker in _ALLOCATION_MARKERS)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised in the main thread, so it unwinds like Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def stop_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` (main thread only: embedding programs calling
    :func:`main` from a thread keep their own handling). A distributed rank replaces it with its
    own handler (:mod:`bigembed.distributed.signals`), which also tells the other ranks."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def skip_exit_collection() -> None:
    """Spare the process CPython's last garbage collection at exit (registered once).

    After the exit hooks, the interpreter collects every container object still alive; with
    torch loaded that walks millions of them, a pause at the end of every rank, server and CLI
    call for memory the OS reclaims anyway. :func:`gc.freeze` as an exit hook moves them out of
    the collector's sight. Only that collection is skipped: the exit hooks registered later
    (temporary directories, multiprocessing's, torch's) run before it, logging's flush after
    it, non-daemon threads have been joined, and what reference counting frees is still freed.
    """
    atexit.unregister(gc.freeze)  # once, however often main() runs in one process
    atexit.register(gc.freeze)


def quiet_torch_loggers() -> None:
    """torch logs cache statistics and the like at INFO (some at interpreter exit, after our
    last line); they are not the user's business unless ``--verbose``."""
    logging.getLogger("torch").setLevel(logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bigembed",
        description="Learn embeddings of huge multi-relation graphs (PyTorch-BigGraph style).",
    )
    parser.add_argument("--version", action="version", version=f"bigembed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMANDS:
        COMMANDS.get(name)(subparsers)
    return parser


def quiet_torch() -> None:
    """Silence torch's C++ warnings (before torch is imported: c10 reads this once).

    c10d prints a warning with a socket dump for every store wait that times out, several a
    second on a distributed rank, burying the lines that matter. ``TORCH_CPP_LOG_LEVEL=INFO``
    (or WARNING) in the environment brings them back.
    """
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def main(argv: Sequence[str] | None = None) -> int:
    quiet_torch()
    skip_exit_collection()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not args.verbose:
        quiet_torch_loggers()
    stop_on_sigterm()
    try:
        return int(args.func(args) or 0)
    except BigembedError as exc:
        print(f"bigembed {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # the environment, not a bug: read-only, no permission, disk full...
        if isinstance(exc, BrokenPipeError):  # `bigembed ... | head`: the reader left
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0
        print(f"bigembed {args.command}: error: {os_error_message(exc)}", file=sys.stderr)
        return BigembedError.exit_code
    except MemoryError:
        print(f"bigembed {args.command}: error: {OUT_OF_MEMORY}", file=sys.stderr)
        return BigembedError.exit_code
    except RuntimeError as exc:
        if not is_allocation_failure(exc):
            raise
        print(
            f"bigembed {args.command}: error: {OUT_OF_MEMORY} ({_first_line(exc)})", file=sys.stderr
        )
        return BigembedError.exit_code
    except Terminated:
        print(f"bigembed {args.command}: interrupted by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"bigembed {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
