"""Training edge paths that look like held-out edges (validation or test sets).

A model trained on its test edges reports results that mean nothing, and nothing fails: PBG's
FB15k config lists the train, valid and test paths together (its example script trains on the
first only), so ``bigembed train`` on it as shipped trains on all three. :func:`held_out_warnings`
names each training path whose own name says valid/test/dev/held-out, or that is the config's
own validation set (``early_stopping.valid_path``). Only the path's last component is read: a
project under a directory called ``test`` is not a test set.
"""

from __future__ import annotations

import re
from pathlib import Path

from bigembed.config.schema import ConfigSchema

#: a word of a path's name that marks held-out edges (words split at anything not a letter or
#: digit: ``fb-test_partitioned``, ``valid.tsv``, ``held_out``)
HELD_OUT_WORD = re.compile(
    r"(?<![a-z0-9])(valid|validation|val|test|testing|dev|held[-_ ]?out|hold[-_ ]?out)(?![a-z0-9])"
)


def held_out_word(path: str) -> str | None:
    """The held-out word in ``path``'s name (its last component), or None."""
    found = HELD_OUT_WORD.search(Path(path).name.lower())
    return found.group(1) if found else None


def _same_path(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:  # an unresolvable path is not the same as anything
        return False


def held_out_warnings(cfg: ConfigSchema) -> list[str]:
    """One line per training edge path that looks like a held-out set, naming it and why."""
    out = []
    valid = cfg.early_stopping.valid_path if cfg.early_stopping is not None else None
    advice = (
        "train on the training edges only (-p edge_paths=TRAIN_PATH) and evaluate on this one "
        "(bigembed eval --edges PATH)"
    )
    for k, path in enumerate(cfg.edge_paths):
        where = f"edge_paths[{k}] {path}"
        if valid is not None and _same_path(path, valid):
            out.append(
                f"{where}: training on the validation edges of early_stopping.valid_path, so "
                f"early stopping measures edges the model learned; {advice}"
            )
        elif (word := held_out_word(path)) is not None:
            out.append(
                f"{where}: training on edges whose name says they are held out ('{word}'); "
                f"if they are a validation or test set, {advice}"
            )
    return out
