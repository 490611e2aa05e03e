"""Settings of every test process (pytest's own and its xdist workers), read before any test.

One torch (OpenMP) thread per process, inherited by the processes the tests start (``bigembed``
commands, ranks, Hogwild workers) through ``OMP_NUM_THREADS``. The suite runs two test files at
once on a 2-core machine and most tests start processes of their own: with torch's default of one
thread per core, the OpenMP threads of several processes wait on each other at every parallel
region of the tiny test batches. Measured on one test (test_out_of_core's bit-identical swap,
the machine busy with other work): 27 s with one thread, 333 s with two. Tests that need the
default thread choice (a rank's share of the cores) remove ``OMP_NUM_THREADS`` from the
environment of the process they start.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # after OMP_NUM_THREADS, which torch reads when it starts its thread pool

torch.set_num_threads(1)
