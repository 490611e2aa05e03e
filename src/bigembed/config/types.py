"""Value types of the config schema, parsed the way PyTorch-BigGraph parses them.

PBG's rules: ints must be ints, floats accept ints, bools accept true/false/yes/no/on/off/1/0
strings (any case), enums are matched case-insensitively. YAML 1.1 reads ``1e-3`` as a
*string* (it wants a dot: ``1.0e-3``), so numbers written that way are accepted too.

The names of operators, comparators, losses and compute dtypes are not listed here: they are
the model's registries (:mod:`bigembed.model.names`), checked by :class:`OneOf`. The registries
of precisions and communication strategies are (the config is below the communication layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, GetCoreSchemaHandler
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from bigembed.model import COMPARATOR_NAMES, COMPUTE_DTYPE_SETTINGS, LOSS_NAMES, OPERATOR_NAMES
from bigembed.registry import Registry

_TRUE = frozenset({"true", "yes", "on", "1", "y", "t"})
_FALSE = frozenset({"false", "no", "off", "0", "n", "f"})


def _to_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise PydanticCustomError(
        "bool_type", "input should be a boolean (true/false/yes/no/on/off/1/0)"
    )


def _to_int(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "input should be an integer, not a boolean")
    if isinstance(value, int):
        return value
    number: float | None = None
    if isinstance(value, float):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
    if number is not None and number == number and abs(number) != float("inf"):
        if number.is_integer():
            return int(number)
        raise PydanticCustomError("int_from_float", "input should be a whole number")
    raise PydanticCustomError("int_type", "input should be a valid integer")


def _to_float(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("float_type", "input should be a number, not a boolean")
    number: float | None = None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise PydanticCustomError("float_type", "input should be a valid number")
    if number != number or abs(number) == float("inf"):
        raise PydanticCustomError("finite_number", "input should be a finite number")
    return number


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 2**10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 2**20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 2**30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 2**40,
}


def _to_bytes(value: Any) -> Any:
    """A size in bytes: a number, or a string with a unit (``2.5GB``, ``512 MiB``)."""
    if isinstance(value, bool):
        raise PydanticCustomError("bytes_type", "input should be a size, not a boolean")
    number: float | None = None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits) :]
        try:
            number = float(digits) * _BYTE_UNITS[unit]
        except (ValueError, KeyError):
            number = None
    if number is None or number != number or abs(number) == float("inf"):
        raise PydanticCustomError(
            "bytes_type", "input should be a size in bytes or with a unit, e.g. 2.5GB or 512MiB"
        )
    return int(number)


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _n3(value: Any) -> Any:
    """PBG spells the regularizer ``N3``; accept any case (``n3``, ``n3_factors``)."""
    if not isinstance(value, str):
        return value
    return {"n3": "N3", "n3_factors": "N3_factors"}.get(value.strip().lower(), value)


Bool = Annotated[bool, BeforeValidator(_to_bool)]
Int = Annotated[int, BeforeValidator(_to_int)]
Float = Annotated[float, BeforeValidator(_to_float)]
#: Marks a type whose validator parses the text of a ``-p key=value`` override itself.
PARSES_TEXT = "parses-text"
Bytes = Annotated[int, BeforeValidator(_to_bytes), PARSES_TEXT]


@dataclass(frozen=True)
class OneOf:
    """``Annotated`` metadata of a ``str`` field: one of ``names``, matched case-insensitively.

    The error reads like pydantic's for a ``Literal`` (``input should be 'a', 'b' or 'c'``, for
    any input, None and numbers included) and carries the names for "did you mean" suggestions;
    ``bigembed config keys`` shows them as the field's type (``a|b|c``).
    """

    names: tuple[str, ...]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        name = _lower(value)
        if isinstance(name, str) and name in self.names:
            return name
        quoted = [repr(n) for n in self.names]
        expected = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if quoted[:-1] else quoted)
        raise PydanticCustomError("choice", "Input should be {expected}", {"expected": expected})


_CODECS = "bigembed.communication.codecs"
_STRATEGIES = "bigembed.communication.strategies"
#: ``communication.precision``: the codec of each precision. Registered here, below
#: :mod:`bigembed.communication` in the layers, so that the config knows the names without
#: importing the codecs (torch).
PRECISIONS: Registry[Any] = Registry(
    "precision",
    [
        ("fp32", f"{_CODECS}:Fp32Codec"),
        ("fp16", f"{_CODECS}:Fp16Codec"),
        ("bf16", f"{_CODECS}:Bf16Codec"),
        ("int8", f"{_CODECS}:Int8Codec"),
    ],
)
#: ``communication.strategy``: how shared parameters are kept in step (one class each in
#: :mod:`bigembed.communication.strategies`), registered here for the same reason.
STRATEGIES: Registry[Any] = Registry(
    "communication strategy",
    [
        ("async_ps", f"{_STRATEGIES}.async_ps:AsyncParameterServer"),
        ("allreduce", f"{_STRATEGIES}.allreduce:Allreduce"),
        ("async_model_average", f"{_STRATEGIES}.async_model_average:AsyncModelAverage"),
        ("decentralized", f"{_STRATEGIES}.decentralized:Decentralized"),
        ("async_decentralized", f"{_STRATEGIES}.async_decentralized:AsyncDecentralized"),
    ],
)
PRECISION_NAMES: tuple[str, ...] = PRECISIONS.names
STRATEGY_NAMES: tuple[str, ...] = STRATEGIES.names
#: ``communication.partition_precision``: how partitions travel to and from partition servers.
PARTITION_PRECISION_NAMES: tuple[str, ...] = ("fp32", "compressed")

#: ``train_type`` values (lower case; matched case-insensitively, ``1vsAll`` as LibKGE writes it).
TRAIN_TYPES: tuple[str, ...] = ("negative_sampling", "1vsall", "kvsall")
#: The ``train_type`` values that score every entity of a type (all_negs on every relation).
ALL_ENTITY_TRAIN_TYPES = ("1vsall", "kvsall")
#: How the docs (and LibKGE) write each ``train_type``.
TRAIN_TYPE_NAMES = {
    "negative_sampling": "negative_sampling",
    "1vsall": "1vsAll",
    "kvsall": "KvsAll",
}

BucketOrderName = Literal["random", "affinity", "inside_out", "outside_in", "buffer"]

#: Config value types named after what they hold (``OperatorName``: a name of an operator of
#: :mod:`bigembed.model.operators`), matched case-insensitively.
OperatorName = Annotated[str, OneOf(OPERATOR_NAMES)]
ComparatorName = Annotated[str, OneOf(COMPARATOR_NAMES)]
LossName = Annotated[str, OneOf(LOSS_NAMES)]
ComputeDtypeName = Annotated[str, OneOf(COMPUTE_DTYPE_SETTINGS)]
PrecisionName = Annotated[str, OneOf(PRECISION_NAMES)]
EvalProtocolName = Annotated[str, OneOf(("full", "sampled"))]
ValidationMetricName = Annotated[str, OneOf(("mrr", "hits@1", "hits@3", "hits@10", "auc"))]
SamplerName = Annotated[str, OneOf(("tpe", "random"))]
PrunerName = Annotated[str, OneOf(("median", "none"))]
TuneParamType = Annotated[str, OneOf(("float", "int", "categorical"))]
StrategyName = Annotated[str, OneOf(STRATEGY_NAMES)]
PartitionPrecisionName = Annotated[str, OneOf(PARTITION_PRECISION_NAMES)]
BucketOrder = Annotated[BucketOrderName, BeforeValidator(_lower)]
#: ``load_balancing``: ``cost`` balances work by the cost model (:mod:`bigembed.train.memory.cost`);
#: ``pbg`` keeps PBG's schedule (lock grants by partition affinity then edge count, Hogwild
#: workers each given an even slice of the bucket).
LoadBalancingName = Literal["cost", "pbg"]
GrowthInitName = Literal["random", "neighbors"]
FreezeName = Literal["old_entities", "relations"]
#: ``growth.edges``: which training edges an extended store's training visits.
GrowthEdgesName = Literal["all", "new"]
GrowthStateName = Literal["zero", "old_mean"]
LoadBalancing = Annotated[LoadBalancingName, BeforeValidator(_lower)]
#: ``distributed_mode``: ``partitioned`` (PBG: trainers train disjoint buckets under partition
#: locks) or ``data_parallel`` (Bagua, DGL-KE: every trainer trains its share of the same
#: bucket's edges and the communication strategy keeps every parameter in step).
DistributedModeName = Literal["partitioned", "data_parallel"]
DistributedMode = Annotated[DistributedModeName, BeforeValidator(_lower)]
#: ``communication.edge_split``: how ``data_parallel`` splits a bucket's edges between trainers:
#: ``load_balancing`` (Bagua's load-balancing sampler over per-edge costs) or ``even`` (equal
#: contiguous slices of the shuffled edges).
EdgeSplitName = Literal["load_balancing", "even"]
EdgeSplit = Annotated[EdgeSplitName, BeforeValidator(_lower)]
#: ``N3``: PBG's N3 terms (each edge's given entity after its relation operator, the other
#: entity, the operator's parameters); ``N3_factors``: Lacroix et al.'s (2018) form, entity,
#: relation and entity each penalised on its own (bigembed only).
Regularizer = Annotated[Literal["N3", "N3_factors"], BeforeValidator(_n3)]
