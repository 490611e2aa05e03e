"""``bigembed config keys KEY...``: one config key in full (type, allowed values, default, how
it compares with PBG, the whole description), found by the name a user would type.

A key may be written as listed (``relations[i].operator``), with an index or a name in place of
the placeholder (``relations[0].operator``, ``entities.user.num_partitions``,
``tune.params.lr.low``), in PBG's mixedCase (``numEpochs``), or by its last part alone when that
names one key (``operator``). An unknown key is a :class:`~bigembed.errors.ConfigError` with the
closest keys, raised before anything is printed.
"""

from __future__ import annotations

import difflib
import re
import textwrap
from collections.abc import Sequence

from bigembed.config.key_listing import KeyInfo, key_infos, terminal_width
from bigembed.config.keys import snake
from bigembed.config.pbg_keys import PBG_DIFFERENCES, pbg_status
from bigembed.errors import ConfigError

#: What a user types in place of the listing's placeholders, and the placeholder.
_PLACEHOLDERS = (
    (re.compile(r"^relations(\[\w*\])?\."), "relations[i]."),
    (re.compile(r"^entities\.[^.]+\."), "entities.TYPE."),
    (re.compile(r"^tune\.params\.[^.]+\."), "tune.params.KEY."),
)


def _canonical(query: str) -> str:
    key = ".".join(snake(part) for part in query.strip().split("."))
    for pattern, placeholder in _PLACEHOLDERS:
        key = pattern.sub(placeholder, key)
    return key.lower()


def find_keys(query: str, infos: Sequence[KeyInfo]) -> list[KeyInfo]:
    """The keys ``query`` names: the exact key, else every key whose last part it is."""
    wanted = _canonical(query)
    exact = [k for k in infos if k.key.lower() == wanted]
    if exact:
        return exact
    return [k for k in infos if k.key.lower().rsplit(".", 1)[-1] == wanted]


def _unknown(query: str, infos: Sequence[KeyInfo]) -> ConfigError:
    keys = [k.key for k in infos]
    close = difflib.get_close_matches(_canonical(query), [k.lower() for k in keys], n=3)
    close += difflib.get_close_matches(
        _canonical(query), [k.lower().rsplit(".", 1)[-1] for k in keys], n=3
    )
    by_lower = {k.lower(): k for k in keys}
    by_last = {k.lower().rsplit(".", 1)[-1]: k for k in keys}
    names = list(dict.fromkeys(by_lower.get(c) or by_last[c] for c in close))[:3]
    hint = f"; did you mean {', '.join(names)}?" if names else ""
    return ConfigError(f"unknown config key {query!r}{hint} (bigembed config keys lists every key)")


def _describe(info: KeyInfo, width: int) -> str:
    status = pbg_status(info.key)
    if status == "differs":
        status += f": {PBG_DIFFERENCES[info.key]}"
    elif status == "new":
        status += " (bigembed only)"
    kind = info.type.replace("|".join(info.allowed), "str") if info.allowed else info.type
    fields = [("type", kind), ("default", info.default)]
    if info.allowed:
        fields.append(("allowed", ", ".join(info.allowed)))
    fields.append(("pbg", status))
    lines = [info.key]
    for name, value in fields:
        lines.append(
            textwrap.fill(
                value, width, initial_indent=f"  {name + ':':<9}", subsequent_indent=" " * 11
            )
        )
    if info.description:
        lines.append(textwrap.indent(textwrap.fill(info.description, width - 2), "  "))
    return "\n".join(lines)


def format_key_help(queries: Sequence[str], width: int | None = None) -> str:
    """The full help of each key ``queries`` names, separated by blank lines."""
    width = width or terminal_width()
    infos = key_infos()
    found: list[KeyInfo] = []
    for query in queries:
        matches = find_keys(query, infos)
        if not matches:
            raise _unknown(query, infos)
        found.extend(m for m in matches if m not in found)
    return "\n\n".join(_describe(info, width) for info in found)
