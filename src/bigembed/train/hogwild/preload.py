"""Imported by the Hogwild workers' forkserver only (see :mod:`bigembed.train.hogwild.guard`).

Importing it makes the current process ignore SIGINT and SIGTERM and loads the worker code,
so that every worker forked later starts with torch and bigembed already imported. Nothing
else imports this module: in any other process the signal change would be wrong.
"""

import signal

# A signal to the whole process group (Ctrl-C, `kill -- -PGID`, `systemctl stop`) must reach
# the trainer, which stops the workers; the forkserver dying of it would make every worker
# look dead to the trainer (their exit statuses come through the forkserver).
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)

import bigembed.train.hogwild.worker  # noqa: E402,F401  (the point of the preload)
