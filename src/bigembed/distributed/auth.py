"""The opt-in shared secret of a distributed run: who may join, and signed control messages.

The rendezvous store (a TCPStore, like torch.distributed's) has no authentication: anybody who
can reach rank 0's port can read and write its keys. With a shared secret set on every rank
(``BIGEMBED_SECRET``, or a file named by ``BIGEMBED_SECRET_FILE`` / ``--secret-file``; never in
the config, which is copied around and published in the store), the run is protected this way:

* **Joining** is a challenge-response: rank 0 publishes a random nonce; a rank proves it knows
  the secret with ``HMAC-SHA256(secret, "join|nonce|rank|its own nonce")`` and rank 0 answers
  with a different HMAC over the same values, so each side knows the other holds the secret.
  The secret itself never leaves a process. Rank 0 admits the first valid proof per rank and
  refuses (and logs) every other attempt.
* **Control messages** (lock server, partition servers, the config comparison) carry an HMAC
  made with a per-run session key, ``HMAC(secret, "session|nonce")``, over the store key they
  are written to and their text; a message without a valid MAC is dropped and logged.

What it does not protect (see docs/distributed.md): the data plane (gloo) is neither
encrypted nor authenticated, and the store's counters (heartbeats, barriers) and the ``abort``
key can still be written by anyone who reaches the port, so a stranger can disrupt a run
(denial of service) though not join it or drive its servers.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from bigembed.errors import ConfigError

logger = logging.getLogger(__name__)

SECRET_ENV = "BIGEMBED_SECRET"
SECRET_FILE_ENV = "BIGEMBED_SECRET_FILE"
BIND_ENV = "BIGEMBED_BIND"
MIN_SECRET_BYTES = 16
MODE_NONE, MODE_HMAC = "none", "hmac-sha256"
_PREFIX = b"bigembed-mac1:"


def load_secret(environ: dict[str, str] | None = None) -> bytes | None:
    """The shared secret from ``BIGEMBED_SECRET`` or the file ``BIGEMBED_SECRET_FILE`` names."""
    env = os.environ if environ is None else environ
    value, file = env.get(SECRET_ENV), env.get(SECRET_FILE_ENV)
    if value and file:
        raise ConfigError(f"set {SECRET_ENV} or {SECRET_FILE_ENV}, not both")
    if file:
        path = Path(file)
        try:
            secret = path.read_bytes().strip()
            mode = path.stat().st_mode
        except OSError as exc:
            raise ConfigError(
                f"{SECRET_FILE_ENV} {file}: cannot read it ({exc.strerror})"
            ) from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning("%s: the secret file is readable by other users (chmod 600 it)", file)
        where = f"{SECRET_FILE_ENV} {file}"
    elif value:
        secret, where = value.encode(), SECRET_ENV
    else:
        return None
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{where}: the shared secret must be at least {MIN_SECRET_BYTES} bytes "
            "(e.g. openssl rand -hex 32 > secret)"
        )
    return secret


def _mac(key: bytes, *parts: str | bytes) -> str:
    msg = b"|".join(p.encode() if isinstance(p, str) else p for p in parts)
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Secret:
    """Proofs of knowing the shared secret (the secret is never sent)."""

    value: bytes

    def join_proof(self, nonce: str, rank: int, client_nonce: str) -> str:
        return _mac(self.value, "join", nonce, str(rank), client_nonce)

    def welcome_proof(self, nonce: str, rank: int, client_nonce: str) -> str:
        return _mac(self.value, "welcome", nonce, str(rank), client_nonce)

    def session(self, nonce: str) -> Session:
        return Session(bytes.fromhex(_mac(self.value, "session", nonce)))


def proof_ok(expected: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


class BadMac(Exception):
    """A store value that does not carry a valid MAC of the run's session key."""


@dataclass(frozen=True)
class Session:
    """The per-run key that signs control-plane messages, each bound to its store key."""

    key: bytes

    def seal(self, store_key: str, text: str | bytes) -> bytes:
        body = text.encode() if isinstance(text, str) else text
        return _PREFIX + _mac(self.key, store_key, body).encode() + b":" + body

    def open(self, store_key: str, value: bytes) -> bytes:
        """The text ``seal`` wrapped for ``store_key``; raises BadMac if it was not."""
        if not value.startswith(_PREFIX):
            raise BadMac(f"{store_key}: unsigned message")
        mac, sep, body = value[len(_PREFIX) :].partition(b":")
        if not sep or not hmac.compare_digest(mac, _mac(self.key, store_key, body).encode()):
            raise BadMac(f"{store_key}: invalid MAC")
        return body


def seal(session: Session | None, store_key: str, text: str) -> str | bytes:
    """``text`` as written to ``store_key``: signed with a session, as is without."""
    return text if session is None else session.seal(store_key, text)


def unseal(session: Session | None, store_key: str, value: bytes) -> bytes:
    """The text read from ``store_key``, checked against the session (BadMac if invalid)."""
    return value if session is None else session.open(store_key, value)


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """``--secret-file`` and ``--bind`` (the same as the environment variables)."""
    parser.add_argument(
        "--secret-file",
        metavar="PATH",
        default=None,
        help=f"file holding the run's shared secret (as {SECRET_FILE_ENV}; or set {SECRET_ENV}); "
        "every rank and partition server must use the same one. Never put it in the config",
    )
    parser.add_argument(
        "--bind",
        metavar="ADDRESS",
        default=None,
        help=f"rank 0: listen for the rendezvous store on this address only (as {BIND_ENV}; "
        "default: the host distributed_init_method names); every rank: use its interface for "
        "gloo",
    )


def apply_security_arguments(args: argparse.Namespace) -> None:
    """Put the flags into the environment (where ranks and launched children read them)."""
    if getattr(args, "secret_file", None):
        os.environ[SECRET_FILE_ENV] = os.path.abspath(args.secret_file)
        os.environ.pop(SECRET_ENV, None)
    if getattr(args, "bind", None):
        os.environ[BIND_ENV] = args.bind
    load_secret()  # a bad secret is a one-line error before anything starts
