"""bench/wordnet_graph.py reads WordNet's database format as documented (wndb(5WN)): the
relations kept, their direction, lexical pointers mapped to synsets, the k-core."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import wordnet_graph  # noqa: E402

LICENSE = "  1 This software and database is being provided to you, the LICENSEE, by\n"
NOUNS = [
    # offset lex_filenum ss_type w_cnt(hex) word lex_id ... p_cnt ptr... | gloss
    "00000001 03 n 01 entity 0 001 ~ 00000002 n 0000 | that which is",
    "00000002 03 n 02 dog 0 domestic_dog 0 003 @ 00000001 n 0000 %m 00000003 n 0000 "
    "+ 00000010 v 0101 | a canine",
    "00000003 03 n 01 pack 0 001 #m 00000002 n 0000 | a group of dogs",
    "00000004 03 n 01 lone 0 001 @i 00000001 n 0000 | an instance",
]
VERBS = [
    "00000010 29 v 01 bark 0 002 + 00000002 n 0101 $ 00000011 v 0000 01 + 02 00 | to bark",
    "00000011 29 v 01 yelp 0 001 $ 00000010 v 0000 01 + 02 00 | to yelp",
]
ADJECTIVES = ["00000020 00 s 01 canine 0 001 & 00000021 a 0000 | dog-like"]


def _dict(tmp_path: Path) -> Path:
    for name, lines in (
        ("data.noun", NOUNS),
        ("data.verb", VERBS),
        ("data.adj", ADJECTIVES),
        ("data.adv", []),
    ):
        (tmp_path / name).write_text(LICENSE + "".join(f"{line}\n" for line in lines))
    return tmp_path


def test_the_eleven_relations_are_read_with_their_direction(tmp_path: Path) -> None:
    edges = list(wordnet_graph.read_edges(_dict(tmp_path), "nvar"))
    assert edges == [
        ("00000002-n", "_hypernym", "00000001-n"),  # "dog" has hypernym "entity"
        ("00000002-n", "_member_meronym", "00000003-n"),
        ("00000002-n", "_derivationally_related_form", "00000010-v"),  # a lexical pointer
        ("00000004-n", "_instance_hypernym", "00000001-n"),
        ("00000010-v", "_derivationally_related_form", "00000002-n"),
        ("00000010-v", "_verb_group", "00000011-v"),
        ("00000011-v", "_verb_group", "00000010-v"),
        ("00000020-a", "_similar_to", "00000021-a"),  # a satellite is an adjective
    ]  # hyponyms (~) and holonyms (#m) are WN18's inverse relations: left out, as in WN18RR
    nouns_verbs = list(wordnet_graph.read_edges(tmp_path, "nv"))
    assert all(not e[0].endswith("-a") and not e[2].endswith("-a") for e in nouns_verbs)
    assert len(nouns_verbs) == 7


def test_k_core_repeats_until_stable() -> None:
    edges = [("a", "r", "b"), ("b", "r", "c"), ("c", "r", "a"), ("c", "r", "d"), ("d", "r", "e")]
    # degree: a 2, b 2, c 3, d 2, e 1 -> e goes, then d has 1 and goes too
    assert wordnet_graph.k_core(edges, 2) == edges[:3]
    assert wordnet_graph.k_core(edges, 1) == edges


def test_an_existing_output_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "wn.tsv"
    out.write_text("mine\n")
    assert wordnet_graph.main([str(out), "--wordnet-dir", str(_dict(tmp_path))]) == 1
    assert out.read_text() == "mine\n"
    assert "exists" in capsys.readouterr().err
