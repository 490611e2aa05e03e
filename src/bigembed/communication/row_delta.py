"""Compressed partition transfers (``communication.partition_precision: compressed``).

A partition travels to a trainer and back each time the trainer needs it. In compressed mode
its owner (the partition server) keeps the exact fp32 master; the trainer receives a bfloat16
copy of the embeddings (half the bytes) and, when it hands the partition back, sends its
*change*: ``trained - received``, quantized row by row to int8 with one float32 scale per row
(a quarter of the bytes, plus 4 per row). The owner adds the decoded change to its master, so
the master is ``trained`` plus the part of the old master bf16 could not represent: nothing
the trainer did is lost, and the master never degrades to bf16 over many transfers.

Errors (per element): the copy the trainer trains on is within bf16's rounding of the master
(relative 2**-8); a row's change arrives within ``max|change of the row| / 254``. The row-Adagrad
state (one float per row) travels in fp32 both ways. Checkpoints are written from exact fp32
fetches, never from the compressed path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bigembed.communication.codecs import NonFiniteError

TRANSFER_DTYPE = torch.bfloat16
_LEVELS = 127


@dataclass
class RowDelta:
    """A partition's change: int8 codes (rows x dim) and one float32 scale per row."""

    codes: Tensor
    scales: Tensor

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * self.scales.numel()

    @staticmethod
    def empty(rows: int, dim: int) -> RowDelta:
        return RowDelta(torch.empty((rows, dim), dtype=torch.int8), torch.empty(rows))

    @staticmethod
    def encode(change: Tensor) -> RowDelta:
        """Symmetric per-row quantization: ``code = round(x / scale)``, ``scale = max|x| / 127``."""
        if change.numel() and not bool(torch.isfinite(change).all()):
            raise NonFiniteError(
                "compressed partition transfer: the trained partition holds NaN/inf values "
                "(the model diverged? try a lower lr)"
            )
        peak = change.abs().amax(dim=1) if change.shape[1] else torch.zeros(change.shape[0])
        scales = peak / _LEVELS
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = (change / safe[:, None]).round_().clamp_(-_LEVELS, _LEVELS).to(torch.int8)
        return RowDelta(codes, scales)

    def decode(self) -> Tensor:
        return self.codes.to(torch.float32) * self.scales[:, None]


def to_transfer(emb: Tensor) -> Tensor:
    """The copy of the embeddings sent to a trainer."""
    if emb.numel() and not bool(torch.isfinite(emb).all()):
        raise NonFiniteError("compressed partition transfer: the partition holds NaN/inf values")
    return emb.to(TRANSFER_DTYPE)
