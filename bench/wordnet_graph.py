"""A WN18RR-like lexical graph built from the WordNet 3.0 database files, for the recipes.

No WordNet link-prediction data set ships with bigembed or can be downloaded here, but the
WordNet 3.0 database itself is a Debian package (``apt-get install wordnet-base``: the files
``/usr/share/wordnet/data.{noun,verb,adj,adv}``) and WN18 / WN18RR were cut from it. This
script keeps the eleven relations of WN18RR (the inverse relations of WN18 removed, so no
test edge can be read back from its inverse in train) between synsets, written as one
``head<TAB>relation<TAB>tail`` file ready for ``bigembed split``:

    python bench/wordnet_graph.py work/wordnet/wordnet.tsv --pos nv --min-degree 2
    bigembed split work/wordnet/wordnet.tsv --output work/wordnet/split \\
        --valid 0.033 --test 0.033 --by-relation --keep-entities-in-train --seed 0

Entities are synsets named like WN18RR's (the 8-digit offset; the part of speech appended,
since WordNet's offsets are unique per data file only). ``--min-degree K`` keeps the K-core
(synsets with at least K edges, repeated until none is removed): WN18's 40,943 synsets were a
selection of the 117,659 of WordNet 3.0, and the core keeps a graph of the same kind and
size without guessing that selection. The printed table gives the counts per relation.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from collections.abc import Iterator
from pathlib import Path

WORDNET_DIR = Path("/usr/share/wordnet")
POS_FILES = {"n": "data.noun", "v": "data.verb", "a": "data.adj", "r": "data.adv"}
# WordNet pointer symbol -> the WN18RR relation name.
RELATIONS = {
    "@": "_hypernym",
    "+": "_derivationally_related_form",
    "@i": "_instance_hypernym",
    "^": "_also_see",
    "%m": "_member_meronym",
    ";c": "_synset_domain_topic_of",
    "%p": "_has_part",
    "-u": "_member_of_domain_usage",
    "-r": "_member_of_domain_region",
    "$": "_verb_group",
    "&": "_similar_to",
}

Edge = tuple[str, str, str]


def _synset(offset: str, pos: str) -> str:
    return f"{offset}-{'a' if pos == 's' else pos}"  # satellite adjectives are adjectives


def read_edges(wordnet_dir: Path, parts_of_speech: str) -> Iterator[Edge]:
    """Every (synset, relation, synset) of the eleven relations between synsets of the given
    parts of speech (``"nv"``: nouns and verbs), in file order."""
    for pos in parts_of_speech:
        path = wordnet_dir / POS_FILES[pos]
        with open(path, encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):  # the license header
                    continue
                fields = line.split(" | ", 1)[0].split()
                head = _synset(fields[0], fields[2])
                words = int(fields[3], 16)
                at = 4 + 2 * words
                for k in range(int(fields[at])):
                    symbol, offset, target_pos, _words = fields[at + 1 + 4 * k : at + 5 + 4 * k]
                    relation = RELATIONS.get(symbol)
                    if relation is not None and target_pos.replace("s", "a") in parts_of_speech:
                        yield head, relation, _synset(offset, target_pos)


def k_core(edges: list[Edge], k: int) -> list[Edge]:
    """The edges between entities of degree >= k, repeated until stable."""
    while True:
        degree: collections.Counter[str] = collections.Counter()
        for h, _r, t in edges:
            degree[h] += 1
            degree[t] += 1
        kept = [e for e in edges if degree[e[0]] >= k and degree[e[2]] >= k]
        if len(kept) == len(edges):
            return kept
        edges = kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the TSV file to write (must not exist)")
    parser.add_argument("--wordnet-dir", type=Path, default=WORDNET_DIR)
    parser.add_argument("--min-degree", type=int, default=1, help="keep the K-core (default 1)")
    parser.add_argument(
        "--pos",
        default="nvar",
        help="parts of speech kept: n(oun) v(erb) a(djective) r (adverb); default nvar",
    )
    args = parser.parse_args(argv)
    if not (args.wordnet_dir / "data.noun").exists():
        print(
            f"wordnet_graph: {args.wordnet_dir / 'data.noun'}: missing "
            "(apt-get install wordnet-base, or --wordnet-dir)",
            file=sys.stderr,
        )
        return 1
    if args.output.exists():
        print(f"wordnet_graph: {args.output}: exists; refusing to overwrite", file=sys.stderr)
        return 1
    # One copy of each edge, in file order.
    edges = list(dict.fromkeys(read_edges(args.wordnet_dir, args.pos)))
    edges = k_core(edges, args.min_degree)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(args.output.name + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(f"{h}\t{r}\t{t}\n" for h, r, t in edges)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.output)
    entities = {h for h, _r, _t in edges} | {t for _h, _r, t in edges}
    counts = collections.Counter(r for _h, r, _t in edges)
    print(f"| relation | edges |  (WordNet 3.0, {args.pos}, {args.min_degree}-core)")
    print("|---|---|")
    for relation, n in counts.most_common():
        print(f"| {relation} | {n:,} |")
    print(f"| **all** ({len(entities):,} synsets) | **{len(edges):,}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
