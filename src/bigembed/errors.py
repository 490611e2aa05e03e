"""User-facing errors.

Anything the user can fix (bad config, malformed input, missing files, a dead peer) raises a
subclass of :class:`BigembedError`. The CLI prints its message on one line, without a
traceback, and exits non-zero. Everything else is a bug and keeps its traceback.
"""


class BigembedError(Exception):
    """An error caused by the user's input or environment, with a message meant for them."""

    exit_code = 2


class ConfigError(BigembedError):
    """The configuration is invalid: the message names the file and the key path."""


class InputError(BigembedError):
    """An input file is missing or malformed: the message names the file (and line)."""


class OutputExistsError(BigembedError):
    """The output already exists and --force was not given."""


class CheckpointError(BigembedError):
    """A checkpoint is missing, incomplete or inconsistent with the config."""


class PeerError(BigembedError):
    """A distributed peer died, timed out or disagrees with us."""
