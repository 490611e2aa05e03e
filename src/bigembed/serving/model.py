"""Query a trained model by entity and relation names: vectors, scores, predictions, neighbours.

Example::

    >>> import bigembed
    >>> model = bigembed.load("work/fb15k237/model")
    >>> model.predict("/m/0f8l9c", "/location/location/contains", k=3)   # top tails
    [Prediction(name='/m/05qtj', score=14.2, type='all'), ...]
    >>> model.predict("/m/05qtj", "/location/location/contains", side="lhs", k=3)  # heads
    >>> model.score(["/m/0f8l9c"], ["/location/location/contains"], ["/m/05qtj"])
    array([14.2], dtype=float32)
    >>> model.similar("/m/0f8l9c", k=5)                                  # nearest entities
    >>> model.vector("/m/0f8l9c").shape
    (400,)

Scores are the model's own (see :mod:`bigembed.ranking.directions`): in standard mode an edge
has one score; with ``dynamic_relations`` it has two, the one used to rank tails
(``side="rhs"``) and the one used to rank heads (``side="lhs"``); :meth:`EmbeddingModel.score`
averages them unless told which. Predictions rank *every* entity of the type across all
partitions, block by block, so memory stays bounded on large graphs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import torch
from torch import Tensor

from bigembed.checkpoints import EntityTables, TrainedModel
from bigembed.errors import InputError
from bigembed.ranking import KnownEdges, direction, pair_scores
from bigembed.serving.ann_files import IndexCache
from bigembed.serving.ann_search import index_predict
from bigembed.serving.errors import QueryError, UnknownNameError, broadcast, check_k, check_name
from bigembed.serving.exclusions import exclusions, known_edges
from bigembed.serving.featurized import feature_embeddings, predict_from_features
from bigembed.serving.ids import ids_to_names, names_to_ids
from bigembed.serving.search import exact_top_k
from bigembed.serving.similar import (
    METRICS,
    as_names,
    as_vectors,
    similar_to_names,
    similar_to_vectors,
)
from bigembed.storage import EntityStore


@dataclass(frozen=True)
class Prediction:
    """One ranked entity: its name, its score (higher is better) and its type."""

    name: str
    score: float
    type: str


class EmbeddingModel:
    """A trained model plus its entity names; built by :func:`load`."""

    def __init__(self, trained: TrainedModel, store: EntityStore, tables: EntityTables) -> None:
        self.trained = trained
        self.store = store
        self.tables = tables
        self.model = trained.model
        self._relations = trained.relation_names
        self._relation_ids = {name: i for i, name in enumerate(self._relations)}
        self._known: dict[tuple[str, ...], KnownEdges] = {}
        self._features: dict[str, dict[str, int]] = {}
        #: ``bigembed index``'s indexes of this version, read at first use (docs/ann_index.md)
        self.indexes = IndexCache(trained, {t: tables.total(t) for t in self.entity_types})

    def __repr__(self) -> str:
        types = ", ".join(f"{t}: {self.tables.total(t):,}" for t in self.entity_types)
        return (
            f"EmbeddingModel({str(self.trained.path)!r}, version {self.trained.version}, "
            f"entities {{{types}}}, {len(self._relations)} relation(s))"
        )

    # ------------------------------------------------------------------ what is there
    @property
    def config(self):
        return self.trained.config

    @property
    def entity_types(self) -> list[str]:
        return list(self.trained.config.entities)

    @property
    def relation_names(self) -> list[str]:
        return list(self._relations)

    def num_entities(self, type: str | None = None) -> int:
        return self.tables.total(self._check_type(type))

    def entity_names(self, type: str | None = None) -> list[str]:
        """Every name of an entity type, in global-id order (partition by partition).

        ``type`` may be left out when the model has one entity type.
        """
        etype = self._check_type(type)
        names: list[str] = []
        for part in range(self.tables.num_partitions(etype)):
            names.extend(self.store.names(etype, part))
        return names

    # ------------------------------------------------------------------ vectors and scores
    def vector(self, name: str, type: str | None = None) -> np.ndarray:
        """The embedding of ``name`` as the model uses it, before any relation operator.

        That is the stored row (renormalised to ``max_norm`` if the config sets it) plus the
        type's global embedding when the model has one.
        """
        etype = self._type_of(name, type)
        return self.vectors([name], etype)[0]

    def vectors(self, names: Sequence[str], type: str | None = None) -> np.ndarray:
        """:meth:`vector` of many names of one type, as a ``(len(names), dim)`` array."""
        etype = (
            self._check_type(type)
            if type is not None or len(self.entity_types) == 1
            else self._type_of(names[0], None)
        )
        ids = self._ids(etype, names)
        with torch.no_grad():
            return self.tables.adjusted(etype, self.tables.gather(etype, ids)).numpy()

    @torch.no_grad()
    def score(
        self,
        lhs: str | Sequence[str],
        rel: str | int | Sequence[str | int],
        rhs: str | Sequence[str],
        *,
        side: str = "both",
    ) -> np.ndarray:
        """Scores of edges ``(lhs[i], rel[i], rhs[i])``; single values broadcast.

        ``side``: "rhs" = the score used to rank tails, "lhs" = the one used to rank heads,
        "both" = their mean. They differ only with dynamic relations.

        >>> model.score("a", "likes", ["b", "c"])
        array([3.1, -0.4], dtype=float32)
        """
        if side not in ("lhs", "rhs", "both"):
            raise QueryError(f"side must be 'lhs', 'rhs' or 'both', not {side!r}")
        lhs_l, rel_l, rhs_l = broadcast(lhs, rel, rhs)
        rel_ids = np.array([self._relation_id(r) for r in rel_l], dtype=np.int64)
        sides = (
            ("rhs",)
            if not self.model.dynamic or side == "rhs"
            else (("lhs",) if side == "lhs" else ("lhs", "rhs"))
        )
        total = np.zeros(len(rel_ids), np.float32)
        for s in sides:
            given, wanted = (lhs_l, rhs_l) if s == "rhs" else (rhs_l, lhs_l)
            for ridx, rows in self._by_relation(rel_ids):
                d = direction(self.model, s, ridx)
                src_ids = self._ids(d.source_type, [given[i] for i in rows])
                dst_ids = self._ids(d.target_type, [wanted[i] for i in rows])
                src = self.tables.gather(d.source_type, src_ids)
                dst = self.tables.gather(d.target_type, dst_ids)
                anchors = d.anchors(src, torch.from_numpy(rel_ids[rows]))
                total[rows] += pair_scores(self.model, anchors, d.candidates(dst)).numpy()
        return total / len(sides)

    # ------------------------------------------------------------------ link prediction
    # A str is also a Sequence[str]: mypy flags the overlap although the str overload, first,
    # is the one that applies (as at runtime, where ``single = isinstance(entity, str)``).
    @overload
    def predict(  # type: ignore[overload-overlap]
        self,
        entity: str,
        rel: str | int | Sequence[str | int],
        k: int = 10,
        *,
        side: str = "rhs",
        filtered: bool | Sequence[str | os.PathLike[str]] = False,
        include_self: bool = False,
        exclude_self: bool | None = None,
        exact: bool = False,
    ) -> list[Prediction]: ...

    @overload
    def predict(
        self,
        entity: Sequence[str],
        rel: str | int | Sequence[str | int],
        k: int = 10,
        *,
        side: str = "rhs",
        filtered: bool | Sequence[str | os.PathLike[str]] = False,
        include_self: bool = False,
        exclude_self: bool | None = None,
        exact: bool = False,
    ) -> list[list[Prediction]]: ...

    @torch.no_grad()
    def predict(
        self,
        entity: str | Sequence[str],
        rel: str | int | Sequence[str | int],
        k: int = 10,
        *,
        side: str = "rhs",
        filtered: bool | Sequence[str | os.PathLike[str]] = False,
        include_self: bool = False,
        exclude_self: bool | None = None,
        exact: bool = False,
    ) -> list[Prediction] | list[list[Prediction]]:
        """The ``k`` best completions of ``(entity, rel, ?)`` (``side="rhs"``, the default) or
        of ``(?, rel, entity)`` (``side="lhs"``), against every entity of the type.

        ``filtered``: leave out the completions that are known true edges: ``True`` uses the
        config's edge paths, or give edge paths / edge files. On a relation within one entity
        type (follows, knows) the given entity itself is never an answer unless
        ``include_self=True`` (``exclude_self=False`` says the same; ``exclude_self=True``, the
        default now, is still accepted). One query (a name) gives a list of
        :class:`Prediction`; a list of names gives one such list per name. Excluded and
        filtered candidates are left out, so fewer than ``k`` come back when ``k`` exceeds
        what is left. When ``bigembed index`` built an index of the candidates' type for this
        version, it proposes the candidates (scores stay exact); ``exact=True`` scans all.

        >>> [p.name for p in model.predict("paris", "capital_of", k=1)]
        ['france']
        """
        if side not in ("lhs", "rhs"):
            raise QueryError(f"side must be 'lhs' or 'rhs', not {side!r}")
        k = check_k(k)
        if exclude_self and include_self:
            raise QueryError("include_self and exclude_self contradict each other; give one")
        leave_out_self = not include_self if exclude_self is None else exclude_self
        single = isinstance(entity, str)
        given_l, rel_l, _ = broadcast(entity, rel, "")
        rel_ids = np.array([self._relation_id(r) for r in rel_l], dtype=np.int64)
        known = known_edges(self.trained, self.store.path, filtered, self._known)
        results: list[list[Prediction]] = [[] for _ in given_l]
        for ridx, rows in self._by_relation(rel_ids):
            d = direction(self.model, side, ridx)
            given = self._ids(d.source_type, [given_l[i] for i in rows])
            anchors = d.anchors(
                self.tables.gather(d.source_type, given), torch.from_numpy(rel_ids[rows])
            )
            same_type = d.source_type == d.target_type
            exclude = exclusions(known, given, rel_ids[rows], side, leave_out_self and same_type)
            target = (d.target_type, side, ridx)
            top = None if exact else index_predict(self, target, anchors, d.candidates, k, exclude)
            if top is None:
                top = exact_top_k(
                    self.tables, anchors, d.target_type, k, d.candidates, self._pairwise, exclude
                )
            for row, best in zip(rows, top, strict=True):
                results[row] = self._predictions(d.target_type, best)
        return results[0] if single else results

    # ------------------------------------------------------------------ nearest neighbours
    # As for predict, a str is also a Sequence[str]; the str overload, first, applies.
    @overload
    def similar(  # type: ignore[overload-overlap]
        self,
        name: str,
        k: int = 10,
        *,
        type: str | None = None,
        metric: str = "cos",
        use_faiss: bool = False,
        include_self: bool = False,
        exact: bool = False,
    ) -> list[Prediction]: ...

    @overload
    def similar(
        self,
        name: Sequence[str],
        k: int = 10,
        *,
        type: str | None = None,
        metric: str = "cos",
        use_faiss: bool = False,
        include_self: bool = False,
        exact: bool = False,
    ) -> list[list[Prediction]]: ...

    @overload
    def similar(
        self,
        name: np.ndarray | Tensor,
        k: int = 10,
        *,
        type: str | None = None,
        metric: str = "cos",
        use_faiss: bool = False,
        include_self: bool = False,
        exact: bool = False,
    ) -> list[Prediction] | list[list[Prediction]]: ...

    @torch.no_grad()
    def similar(
        self,
        name: str | Sequence[str] | np.ndarray | Tensor,
        k: int = 10,
        *,
        type: str | None = None,
        metric: str = "cos",
        use_faiss: bool = False,
        include_self: bool = False,
        exact: bool = False,
    ) -> list[Prediction] | list[list[Prediction]]:
        """The ``k`` entities closest to ``name``: an entity name, a list of names (one answer
        each, a list of lists) or a vector (a numpy array or torch tensor of the embedding
        dimension, e.g. a :meth:`vector` or a mean of them; a 2-D array gives one answer per
        row). A vector is compared with the entities of ``type`` (needed only when the model
        has several types) in the space :meth:`vector` answers in.

        ``metric``: "cos" (cosine similarity), "dot" (inner product) or "l2" (score = minus the
        Euclidean distance). A named entity itself is left out of its answer unless
        ``include_self`` (then it comes first for "cos" and "l2").
        When ``bigembed index`` built an index of the type for this version with the same
        metric, it proposes the neighbours (scores stay exact); otherwise, or with
        ``exact=True``, an exact search, chunked over partitions, where ``use_faiss=True``
        uses FAISS for each block when it is installed (and falls back to the exact torch
        search, with a warning, when it is not).

        >>> [p.name for p in model.similar("paris", k=3)]
        ['lyon', 'marseille', 'nice']
        >>> [[p.name for p in ps] for ps in model.similar(["paris", "rome"], k=1)]
        [['lyon'], ['milan']]
        >>> model.similar(model.vectors(["paris", "rome"]).mean(0), k=2)
        """
        if metric not in METRICS:
            raise QueryError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
        k = check_k(k)
        vectors = as_vectors(name)
        if vectors is not None:
            found = similar_to_vectors(self, vectors, k, type, metric, use_faiss, exact)
            return found[0] if np.ndim(name) == 1 else found
        names = [name] if isinstance(name, str) else as_names(name)
        found = similar_to_names(self, names, k, type, metric, use_faiss, include_self, exact)
        return found[0] if isinstance(name, str) else found

    # ------------------------------------------------------------------ featurized types
    def embed(
        self,
        features: Sequence[str] | Sequence[Sequence[str]],
        *,
        weights: Sequence[float] | Sequence[Sequence[float]] | None = None,
        type: str | None = None,
    ) -> np.ndarray:
        """The embedding of an entity of a featurized type given by its features (seen in
        training or not), as :meth:`vector` answers: the weighted mean of the features' rows
        (plus the global embedding). A list of lists gives one row per bag. Unknown features
        are ignored. See docs/featurized.md.

        >>> model.similar(model.embed(["genre:jazz", "decade:1960"]), type="item", k=5)
        """
        etype, rows, single = feature_embeddings(self, features, weights, type)
        out = self.tables.adjusted(etype, rows).numpy()
        return out[0] if single else out

    def predict_features(
        self,
        features: Sequence[str] | Sequence[Sequence[str]],
        rel: str | int,
        k: int = 10,
        *,
        side: str = "rhs",
        weights: Sequence[float] | Sequence[Sequence[float]] | None = None,
        type: str | None = None,
    ) -> list[Prediction] | list[list[Prediction]]:
        """:meth:`predict` for an entity of a featurized type given by its features."""
        return predict_from_features(self, features, rel, check_k(k), side, weights, type)

    def _feature_ids(self, etype: str) -> dict[str, int]:
        if etype not in self._features:
            names = self.store.feature_names(etype)
            self._features[etype] = {name: i for i, name in enumerate(names)}
        return self._features[etype]

    # ------------------------------------------------------------------ search helpers
    def _pairwise(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        """The comparator's (anchors x candidates) score matrix."""
        return self.model.comparator.neg(anchors.unsqueeze(0), candidates.unsqueeze(0))[0]

    def _predictions(self, etype: str, best: list[tuple[int, float]]) -> list[Prediction]:
        names = ids_to_names(
            self.store, self.tables, etype, np.array([i for i, _ in best], dtype=np.int64)
        )
        return [
            Prediction(n, float(s) + 0.0, etype)  # + 0.0: no -0.0 in output
            for n, (_, s) in zip(names, best, strict=True)
        ]

    # ------------------------------------------------------------------ names <-> ids
    def _ids(self, etype: str, names: Sequence[str]) -> np.ndarray:
        return names_to_ids(self.store, self.tables, etype, names)

    def _check_type(self, type: str | None) -> str:
        if type is None:
            if len(self.entity_types) == 1:
                return self.entity_types[0]
            types = ", ".join(self.entity_types)
            raise InputError(f"the model has several entity types ({types}); pass type=")
        if type not in self.trained.config.entities:
            raise UnknownNameError(
                f"unknown entity type {type!r} (known: {', '.join(self.entity_types)})"
            )
        return type

    def _type_of(self, name: str, type: str | None) -> str:
        check_name(name)
        if type is not None or len(self.entity_types) == 1:
            return self._check_type(type)
        found = [t for t in self.entity_types if self.store.offset_of(t, name) is not None]
        if not found:
            raise UnknownNameError(f"unknown entity {name!r} (no entity type has it)")
        if len(found) > 1:
            raise InputError(
                f"entity {name!r} exists in several types ({', '.join(found)}); pass type="
            )
        return found[0]

    def _relation_id(self, rel: str | int) -> int:
        if isinstance(rel, (int, np.integer)) and not isinstance(rel, bool):
            if not 0 <= int(rel) < len(self._relations):
                raise UnknownNameError(
                    f"relation id {rel} out of range (0..{len(self._relations) - 1})"
                )
            return int(rel)
        if not isinstance(rel, str):
            raise QueryError(
                f"a relation is a name (str) or an id (int), got {rel!r} ({type(rel).__name__})"
            )
        rid = self._relation_ids.get(rel)
        if rid is None:
            sample = ", ".join(repr(r) for r in self._relations[:5])
            more = ", ..." if len(self._relations) > 5 else ""
            raise UnknownNameError(
                f"unknown relation {rel!r} (the model has {len(self._relations)}: {sample}{more})"
            )
        return rid

    def _by_relation(self, rel_ids: np.ndarray):
        """(relation, rows) groups: one group in dynamic mode (ids go per row)."""
        if self.model.dynamic:
            yield 0, np.arange(len(rel_ids))
            return
        for ridx in np.unique(rel_ids).tolist():
            yield ridx, np.flatnonzero(rel_ids == ridx)
