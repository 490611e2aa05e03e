"""``bigembed predict`` and ``bigembed similar``: query a trained model by names."""

from __future__ import annotations

import argparse
import json

from bigembed.commands.versions import add_version_argument, checkpoint_of


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
    p.add_argument(
        "--exclude-self",
        action="store_true",
        help="never answer the given entity itself (relations within one entity type)",
    )
    _common(p)
    p.set_defaults(func=run_predict)

    s = subparsers.add_parser(
        "similar",
        help="nearest entities to NAME by embedding (cosine, dot or L2)",
        description="Print the K entities of NAME's type whose embeddings are closest to NAME's "
        "(exact search over all partitions; --faiss uses FAISS when installed).",
    )
    s.add_argument("checkpoint_dir", help="a checkpoint directory (the config's checkpoint_path)")
    s.add_argument("name", help="entity name")
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
    p.add_argument("--entity-path", help="entity names (default: the checkpoint config's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_version_argument(p)


def _print(predictions, args: argparse.Namespace, title: str) -> None:
    if args.json:
        print(
            json.dumps(
                [
                    {"rank": i, "name": p.name, "score": p.score, "type": p.type}
                    for i, p in enumerate(predictions, start=1)
                ],
                indent=1,
            )
        )
        return
    print(title)
    width = max([len(p.name) for p in predictions] + [4])
    print(f"{'rank':>5}  {'name':<{width}}  score")
    for i, p in enumerate(predictions, start=1):
        print(f"{i:>5}  {p.name:<{width}}  {p.score:.6g}")


def run_predict(args: argparse.Namespace) -> int:
    from bigembed.serving import load

    model = load(checkpoint_of(args.checkpoint_dir, args), args.entity_path)
    rel: str | int = args.rel
    if rel not in model.relation_names and str(rel).isdigit():
        rel = int(rel)
    side = "rhs" if args.lhs is not None else "lhs"
    entity = args.lhs if args.lhs is not None else args.rhs
    filtered: bool | list[str] = False
    if args.filtered is not None:
        filtered = args.filtered if args.filtered else True
    preds = model.predict(
        entity, rel, k=args.k, side=side, filtered=filtered, exclude_self=args.exclude_self
    )
    edge = f"({entity}, {args.rel}, ?)" if side == "rhs" else f"(?, {args.rel}, {entity})"
    what = "tails" if side == "rhs" else "heads"
    note = ", known edges filtered out" if filtered else ""
    note += ", itself left out" if args.exclude_self else ""
    _print(preds, args, f"Best {what} for {edge}{note}:")
    return 0


def run_similar(args: argparse.Namespace) -> int:
    from bigembed.serving import load

    model = load(checkpoint_of(args.checkpoint_dir, args), args.entity_path)
    preds = model.similar(
        args.name,
        k=args.k,
        type=args.type,
        metric=args.metric,
        use_faiss=args.faiss,
        include_self=args.include_self,
    )
    _print(preds, args, f"Nearest to {args.name} ({args.metric}):")
    return 0
