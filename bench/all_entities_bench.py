"""All-entity negatives (``train_type: 1vsAll`` / ``all_negs``): one training step, timed.

Builds a ComplEx model (complex_diagonal + dot, dynamic relations, softmax) over a table of
FB15k-237's size (14,541 rows, 237 relations) or WN18RR's (40,943 rows, 11 relations) and times
``BatchTrainer.step`` on random batches with every entity a negative on both sides: the tiled
kernel of :mod:`bigembed.model.all_entities` (what training uses) and the previous score-block
path (the (B, N) matrix through the generic softmax loss), interleaved in the same run, best of
``--rounds``; "before" also uses the sparse row-Adagrad update over every row id that the
step used before. The whole step counts (gathers, operator, loss, backward, row-Adagrad update of
every row). In the same run it measures the torch.mm peak (a (2048, 2048) x (2048, 2048)
product, same threads and dtype) and prints the step's useful FLOP rate as a share of it:
12 N D FLOP per edge (2 corrupted sides x 3 products of 2 N D).

    python bench/all_entities_bench.py                 # fp32, 2 threads
    python bench/all_entities_bench.py --dtype bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import torch

from bigembed.buckets import Batch
from bigembed.kernels import BatchTrainer, Table, row_adagrad_update
from bigembed.model import ModelSpec, NegativeSettings, RelationSpec, ScoringModel, SideEmbeddings
from bigembed.train import keep_freed_memory

SHAPES = {  # name: (entities, relations)
    "FB15k-237": (14_541, 237),
    "WN18RR": (40_943, 11),
}


def make_trainer(dim: int, relations: int, dtype: str, batch: int) -> BatchTrainer:
    spec = ModelSpec(
        relations=(RelationSpec("e", "e", "complex_diagonal", all_negs=True),),
        entity_dims={"e": dim},
        comparator="dot",
        loss="softmax",
        global_emb=False,
        dynamic_relations=True,
        num_dynamic_relations=relations,
        regularization_coef=0.0,
        compute_dtype=dtype,
    )
    model = ScoringModel(spec)
    states = [torch.zeros_like(p) for p in model.parameters()]
    negs = NegativeSettings(num_batch_negs=0, num_uniform_negs=0, uniform_group=batch)
    return BatchTrainer(model, states, negs, 0.1, 0.1, torch.Generator().manual_seed(0))


def sparse_update(
    self: BatchTrainer, lhs: Table, rhs: Table, lhs_side: SideEmbeddings, rhs_side: SideEmbeddings
) -> None:
    """The update before this change: sparse row-Adagrad over every row id and the positives."""
    updates = []
    for side in (lhs_side, rhs_side):
        if side.pos.grad is not None:
            updates.append((side.pos_idx, side.pos.grad))
        if side.all is not None and side.all.grad is not None:
            updates.append((torch.arange(side.all.shape[0]), side.all.grad))
    row_adagrad_update(lhs.emb, lhs.state, updates, self.lr)  # one table: lhs is rhs here


def mm_peak(dtype: torch.dtype, reps: int = 5) -> float:
    """GFLOP/s of a square 2048 product (best of ``reps``)."""
    n = 2048
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def time_steps(
    trainer: BatchTrainer, table: Table, entities: int, relations: int, batch: int, steps: int
) -> float:
    def one() -> None:
        trainer.step(
            Batch(
                torch.randint(entities, (batch,)),
                torch.randint(entities, (batch,)),
                torch.randint(relations, (batch,)),
                0,
                None,
            ),
            table,
            table,
        )

    one()
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    return (time.perf_counter() - t0) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dims", default="128,400", help="comma-separated dimensions")
    parser.add_argument("--shapes", default="FB15k-237,WN18RR", help="of: " + ", ".join(SHAPES))
    parser.add_argument("--no-before", action="store_true", help="skip the score-block path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    rows = []
    peaks = []
    for shape in args.shapes.split(","):
        entities, relations = SHAPES[shape]
        for dim in (int(d) for d in args.dims.split(",")):
            table = Table(torch.randn(entities, dim) * 1e-2, torch.zeros(entities))
            trainer = make_trainer(dim, relations, args.dtype, args.batch)
            paths = [True] if args.no_before else [False, True]
            best = dict.fromkeys(paths, float("inf"))
            for _ in range(args.rounds):
                peaks.append(mm_peak(tdtype))
                for tiled in paths:
                    trainer.model.all_entities_kernel = tiled  # False: the score-block path
                    before = mock.patch.object(BatchTrainer, "_update_all_rows", sparse_update)
                    with contextlib.nullcontext() if tiled else before:
                        secs = time_steps(
                            trainer, table, entities, relations, args.batch, args.steps
                        )
                    best[tiled] = min(best[tiled], secs)
            for tiled in paths:
                rows.append((shape, entities, dim, tiled, best[tiled]))
    peak = max(peaks)
    print(
        f"\nall-entity negatives, BatchTrainer.step, batch {args.batch}, {args.dtype}, "
        f"{args.threads} threads, best of {args.rounds} x {args.steps} steps; torch.mm peak "
        f"{peak:.1f} GFLOP/s ({args.dtype}, 2048^3, same run)"
    )
    print("| graph | entities | dim | path | ms/step | edges/s | GFLOP/s | of mm peak |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, entities, dim, tiled, secs in rows:
        gflops = 12 * entities * dim * args.batch / secs / 1e9
        path = "tiled (this)" if tiled else "score blocks (before)"
        print(
            f"| {shape} | {entities:,} | {dim} | {path} | {secs * 1e3:,.0f} | "
            f"{args.batch / secs:,.0f} | {gflops:.1f} | {gflops / peak:.0%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
