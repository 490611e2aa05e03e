"""Helpers shared by the tests and the benchmarks: build a graph, write a checkpoint, start ranks.

Imported as ``from support.graphs import graph_config`` (pytest puts ``tests/`` on ``sys.path``,
as ``tests/`` has no ``__init__``; bench scripts do it through ``bench/support_path.py``). A test
module never imports another test module, and nothing here imports a test or ``bench/``.

* :mod:`support.graphs`: planted graphs written straight into the storage format, their
  configs, bucket-by-bucket layouts, memory budgets;
* :mod:`support.imports`: TSV edge lists and import configs for the importer's tests;
* :mod:`support.checkpoints`: named-edge graphs, hand-written and tiny trained checkpoints
  (eval, export, query, interop);
* :mod:`support.steps`: fresh ``BatchTrainer`` s and tables for one-step comparisons;
* :mod:`support.partition_stores`: partition stores driven without a trainer;
* :mod:`support.ranks`: ``bigembed`` as a subprocess, ranks on 127.0.0.1, the lock server's
  event log, the rendezvous store;
* :mod:`support.launches`: ``bigembed launch`` runs with shared parameters;
* :mod:`support.tree_memory`: the memory of a process tree, sampled from /proc;
* :mod:`support.netns`: network namespaces joined by shaped links (root only).
"""
