"""The one JSON form of records (bigembed.serialization): fields are keys, None is left out,
and a form that does not validate is refused in one line naming the key."""

from __future__ import annotations

import pytest
from pydantic.dataclasses import dataclass

from bigembed.serialization import RECORD_CONFIG, JsonForm, NonNegativeInt, RecordError, omit_none
from bigembed.train.records import BucketRecord, parse_records


@dataclass(config=RECORD_CONFIG)
class _Sample(JsonForm):
    count: NonNegativeInt
    label: str = "x"
    extra: int | None = omit_none()
    renamed: float | None = omit_none(key="on_disk")


def test_fields_are_keys_and_none_is_left_out() -> None:
    assert _Sample(3).to_json() == {"count": 3, "label": "x"}
    record = _Sample(3, extra=1, renamed=0.5)
    assert record.to_json() == {"count": 3, "label": "x", "extra": 1, "on_disk": 0.5}
    assert _Sample.from_json(record.to_json()) == record


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"count": -1}, "f.json: count is -1, not a non-negative integer"),
        ({"count": True}, "f.json: count is True, not a non-negative integer"),
        ({"count": None}, "f.json: count is null"),
        ({}, "f.json: no 'count'"),
        ([], "f.json: input should be a dictionary or an instance of _Sample"),
        ({"count": 1, "extra": "many"}, "f.json: extra is 'many': input should be a valid"),
    ],
)
def test_a_bad_form_is_one_line_naming_the_key(data: object, message: str) -> None:
    with pytest.raises(RecordError) as err:
        _Sample.from_json(data, "f.json")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_stats_record_that_does_not_validate_is_skipped() -> None:
    bad = {"type": "bucket", "version": 1, "lhs_partition": 0, "rhs_partition": 0}
    with pytest.raises(RecordError, match="no 'stats'"):
        BucketRecord.from_json(bad)
    good = {**bad, "stats": {"count": 2}}
    log = parse_records([bad, good])
    assert [b.stats.count for b in log.buckets] == [2]
