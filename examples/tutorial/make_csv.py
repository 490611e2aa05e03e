"""Write a small CSV graph for docs/tutorial_csv.md: people in circles, who follows whom.

``python examples/tutorial/make_csv.py friends.csv`` writes ``person,relation,other`` rows
with a header: 400 people in 20 circles; ``follows`` links people of the same circle,
``mentors`` links a circle to the next one. Deterministic (fixed seed), about 6,000 edges.
"""

from __future__ import annotations

import random
import sys


def main(path: str) -> None:
    rng = random.Random(13)
    circles, size = 20, 20
    people = [f"person_{c:02d}_{i:02d}" for c in range(circles) for i in range(size)]
    rows = set()
    for index, who in enumerate(people):
        c = index // size
        for _ in range(10):
            rows.add((who, "follows", people[c * size + rng.randrange(size)]))
        for _ in range(5):
            rows.add((who, "mentors", people[((c + 1) % circles) * size + rng.randrange(size)]))
    ordered = sorted(rows)
    rng.shuffle(ordered)
    with open(path, "w", encoding="utf-8") as f:
        f.write("person,relation,other\n")
        f.writelines(f"{h},{r},{t}\n" for h, r, t in ordered)
    print(f"Wrote {len(ordered)} edges to {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "friends.csv")
