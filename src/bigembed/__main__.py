"""``python -m bigembed ARGS``: the ``bigembed`` command (also torchrun's ``-m bigembed``)."""

import sys

from bigembed.cli import main

sys.exit(main())
