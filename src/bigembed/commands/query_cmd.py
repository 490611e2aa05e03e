"""``bigembed predict`` and ``bigembed similar``: query a trained model by names."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from bigembed.commands.versions import add_version_argument, checkpoint_of
from bigembed.errors import InputError

if TYPE_CHECKING:
    import numpy as np


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "predict",
        help="link prediction: the best tails of (LHS, REL, ?) or heads of (?, REL, RHS)",
        description="Rank every entity of the type as the missing side of an edge and print the "
        "best K, e.g. bigembed predict work/fb15k237/model --lhs /m/0f8l9c --rel "
        "/location/location/contains",
    )
    p.add_argument("checkpoint_dir", help="a checkpoint directory (the config's checkpoint_path)")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--lhs", help="the known head: predict tails")
    given.add_argument("--rhs", help="the known tail: predict heads")
    p.add_argument("--rel", required=True, help="relation name (or id)")
    p.add_argument("-k", type=int, default=10, help="how many to print (a positive integer, 10)")
    p.add_argument(
        "--filtered",
        nargs="*",
        metavar="EDGES",
        help="leave out known true edges: from these edge paths/files, or with no "
        "value from the config's edge_paths",
    )
    own = p.add_mutually_exclusive_group()
    own.add_argument(
        "--include-self",
        action="store_true",
        help="let the given entity itself be an answer (on relations within one entity type it "
        "is left out by default)",
    )
    own.add_argument(
        "--exclude-self",
        action="store_true",
        help="leave the given entity itself out (the default; kept for older scripts)",
    )
    _common(p)
    p.set_defaults(func=run_predict)

    s = subparsers.add_parser(
        "similar",
        help="nearest entities to NAME... or to a vector by embedding (cosine, dot or L2)",
        description="Print the K entities of NAME's type whose embeddings are closest to NAME's, "
        "one block per NAME, or closest to a given vector (--vector; its entity type is --type "
        "when the model has several). Exact search over all partitions; --faiss uses FAISS "
        "when installed.",
    )
    s.add_argument("checkpoint_dir", help="a checkpoint directory (the config's checkpoint_path)")
    # NAME then NAME...: two positionals, so that names may follow options (`similar MODEL
    # --version best NAME`); one nargs="*" positional would be consumed empty before them
    s.add_argument("name", metavar="NAME", help="entity name (or vector, with --vector)")
    s.add_argument("more", nargs="*", metavar="NAME", help="more names: one answer each")
    s.add_argument(
        "--vector",
        action="store_true",
        help="the NAMEs are query vectors: .npy files (one vector, or one per row) or "
        "comma-separated numbers (after --, e.g. -- -0.1,0.5,..., when the first is negative)",
    )
    s.add_argument("-k", type=int, default=10, help="how many to print (a positive integer, 10)")
    s.add_argument("--type", help="entity type (needed only when NAME is in several types)")
    s.add_argument(
        "--metric",
        choices=("cos", "dot", "l2"),
        default="cos",
        help="similarity: cos (default), dot, or l2 (score = -distance)",
    )
    s.add_argument("--faiss", action="store_true", help="search with FAISS if installed")
    s.add_argument(
        "--include-self",
        action="store_true",
        help="list NAME itself too (left out by default)",
    )
    _common(s)
    s.set_defaults(func=run_similar)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--exact",
        action="store_true",
        help="scan every entity even when bigembed index built an index of this version",
    )
    p.add_argument("--entity-path", help="entity names (default: the checkpoint config's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_version_argument(p)


def _rows(predictions) -> list[dict]:
    return [
        {"rank": i, "name": p.name, "score": p.score, "type": p.type}
        for i, p in enumerate(predictions, start=1)
    ]


def _print(predictions, args: argparse.Namespace, title: str) -> None:
    if args.json:
        print(json.dumps(_rows(predictions), indent=1))
        return
    print(title)
    width = max([len(p.name) for p in predictions] + [4])
    print(f"{'rank':>5}  {'name':<{width}}  score")
    for i, p in enumerate(predictions, start=1):
        print(f"{i:>5}  {p.name:<{width}}  {p.score:.6g}")


def run_predict(args: argparse.Namespace) -> int:
    from bigembed.serving import load

    model = load(checkpoint_of(args.checkpoint_dir, args), args.entity_path, version="latest")
    rel: str | int = args.rel
    if rel not in model.relation_names and str(rel).isdigit():
        rel = int(rel)
    side = "rhs" if args.lhs is not None else "lhs"
    entity = args.lhs if args.lhs is not None else args.rhs
    filtered: bool | list[str] = False
    if args.filtered is not None:
        filtered = args.filtered if args.filtered else True
    preds = model.predict(
        entity,
        rel,
        k=args.k,
        side=side,
        filtered=filtered,
        include_self=args.include_self,
        exact=args.exact,
    )
    edge = f"({entity}, {args.rel}, ?)" if side == "rhs" else f"(?, {args.rel}, {entity})"
    what = "tails" if side == "rhs" else "heads"
    note = ", known edges filtered out" if filtered else ""
    _print(preds, args, f"Best {what} for {edge}{note}:")
    return 0


def run_similar(args: argparse.Namespace) -> int:
    import numpy as np

    from bigembed.serving import load

    model = load(checkpoint_of(args.checkpoint_dir, args), args.entity_path, version="latest")
    options = dict(
        k=args.k, type=args.type, metric=args.metric, use_faiss=args.faiss, exact=args.exact
    )
    given = [args.name, *args.more]
    if args.vector:
        read = [read_vectors(v) for v in given]
        if len({r.shape[1] for r in read}) > 1:
            sizes = ", ".join(str(r.shape[1]) for r in read)
            raise InputError(f"--vector: the vectors differ in length ({sizes})")
        queries = [
            _label(v) if len(r) == 1 else f"{_label(v)} row {i + 1}"
            for v, r in zip(given, read, strict=True)
            for i in range(len(r))
        ]
        answers = model.similar(np.concatenate(read), **options)
    else:
        queries = given
        answers = model.similar(queries, include_self=args.include_self, **options)
    if args.json and len(queries) > 1:  # one query keeps the plain list of rows
        blocks = [{"query": q, "results": _rows(a)} for q, a in zip(queries, answers, strict=True)]
        print(json.dumps(blocks, indent=1))
        return 0
    for i, (query, answer) in enumerate(zip(queries, answers, strict=True)):
        if i and not args.json:
            print()
        _print(answer, args, f"Nearest to {query} ({args.metric}):")
    return 0


def _label(vector: str) -> str:
    """A query vector's name in the output: its file's name, or its numbers (cut short)."""
    if vector.endswith(".npy"):
        return Path(vector).name
    return vector if len(vector) <= 40 else vector[:37] + "..."


def read_vectors(value: str) -> np.ndarray:
    """``--vector``: a .npy file (1-D, or 2-D with one vector per row) or comma-separated
    numbers, as a float ``(n, dim)`` array; one line naming the problem otherwise."""
    import numpy as np

    if value.endswith(".npy"):
        try:
            array = np.load(value, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"--vector {value}: cannot read it as a .npy array ({exc})") from None
        if array.dtype.kind not in "fiu" or array.ndim not in (1, 2) or array.size == 0:
            raise InputError(
                f"--vector {value}: holds a {array.dtype} array of shape {array.shape}; "
                "expected numbers, one vector (dim,) or one per row (n, dim)"
            )
        return np.asarray(array, dtype=np.float32).reshape(-1, array.shape[-1])
    try:
        values = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            f"--vector {value[:40]!r}: neither a .npy file nor comma-separated numbers"
        ) from None
    if not values:
        raise InputError("--vector: no numbers given")
    return np.asarray(values, dtype=np.float32).reshape(1, -1)
