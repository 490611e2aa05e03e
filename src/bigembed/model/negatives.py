"""Scoring a batch against its negatives, chunk by chunk, with one batched matmul per part.

For one *direction* (the ``src`` side is corrupted, the ``dst`` side is the anchor), a batch of
B positives is scored against:

* **batch negatives**: the other positives' ``src`` entities in the same chunk of
  ``chunk_size`` positives (the positive itself and padding are masked);
* **uniform negatives**: ``num_uniform`` entities drawn from the ``src`` partition, shared by a
  group of ``group_size`` consecutive positives (PBG shares them per chunk; sharing them over a
  larger group turns many small products into one large one that runs near the matmul peak);
* **the query entity** (option ``self_negative``): one more column, each row's own entity of
  the other side (the head when the tail is corrupted), masked where it is the true answer;
* **all negatives**: every entity of the ``src`` partition (the positive itself is masked).

Masked scores are set to -1e9, as PBG does, so they weigh nothing in any loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bigembed.model.comparators import Comparator

MASKED = -1e9


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pad_rows(x: Tensor, rows: int) -> Tensor:
    """``x`` with zero rows appended up to ``rows`` (``x`` itself when it has them already)."""
    if x.shape[0] == rows:
        return x
    return torch.cat((x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))), dim=0)


def batch_negative_mask(num: int, chunk_size: int) -> Tensor:
    """(num, chunk_size) True where a batch negative is the row's own positive or padding."""
    col = torch.arange(chunk_size).unsqueeze(0)
    rows = torch.arange(num).unsqueeze(1)
    own = col == rows % chunk_size
    if num % chunk_size == 0:
        return own
    return own | (rows - rows % chunk_size + col >= num)


def batch_negative_unmasked(num: int, chunk_size: int) -> Tensor:
    """Per row (float64): its batch negatives that :func:`batch_negative_mask` leaves
    unmasked (the chunk less the row itself and a short last chunk's padding)."""
    chunk_size = min(chunk_size, num)
    start = torch.arange(num) // chunk_size * chunk_size
    real = (num - start).clamp(max=chunk_size)
    return (real - 1).double()


def batch_negative_scores(
    comparator: Comparator, anchors: Tensor, src: Tensor, chunk_size: int, dtype: torch.dtype
) -> Tensor:
    """Scores ``(B, chunk_size)`` of each anchor against the src entities of its chunk."""
    num = anchors.shape[0]
    chunk_size = min(chunk_size, num)
    chunks = _ceil_div(num, chunk_size)
    padded = chunks * chunk_size
    a = pad_rows(anchors, padded).view(chunks, chunk_size, -1)
    s = pad_rows(src, padded).view(chunks, chunk_size, -1)
    scores = comparator.neg(a.to(dtype), s.to(dtype)).float().view(padded, chunk_size)
    # Slicing is not free under autograd (its backward allocates and copies): only when padded.
    if padded != num:
        scores = scores[:num]
    elif not scores.requires_grad:
        # Scoring only (evaluation): each row's own positive is the diagonal of its chunk's
        # block; filling it in place touches B entries instead of building a (B, chunk) mask
        # and copying the whole block. Same values as the masked_fill below.
        scores.view(chunks, chunk_size, chunk_size).diagonal(dim1=1, dim2=2).fill_(MASKED)
        return scores
    return scores.masked_fill(batch_negative_mask(num, chunk_size), MASKED)


def shared_negative_scores(
    comparator: Comparator, anchors: Tensor, negs: Tensor, group_size: int, dtype: torch.dtype
) -> Tensor:
    """Scores ``(B, N)`` of each anchor against the negatives of its group.

    ``negs`` is ``(groups, N, D)``, one set of negatives per group of ``group_size`` anchors.
    """
    num = anchors.shape[0]
    groups = negs.shape[0]
    padded = groups * group_size
    a = pad_rows(anchors, padded).view(groups, group_size, -1)
    scores = comparator.neg(a.to(dtype), negs.to(dtype)).float().view(padded, -1)
    return scores if padded == num else scores[:num]


def self_negative_scores(
    comparator: Comparator, anchors: Tensor, rows: Tensor, mask: Tensor, dtype: torch.dtype
) -> Tensor:
    """Scores ``(B, 1)`` of each anchor against its own query entity ``rows`` (B, D), masked
    where ``mask`` (B,) says it is the row's true answer (h == t)."""
    scores = comparator.pos(anchors.to(dtype), rows.to(dtype)).float().unsqueeze(1)
    return scores.masked_fill(mask.unsqueeze(1), MASKED)


def mask_positives(scores: Tensor, positive_idx: Tensor) -> Tensor:
    """For all-negatives scoring: mask each row's own positive entity."""
    return scores.scatter(1, positive_idx.long().unsqueeze(1), MASKED)


def num_groups(batch: int, group_size: int) -> int:
    return _ceil_div(batch, group_size)
