"""One partition's two files in a checkpoint version: its embeddings ``(count, dim)`` and its
row-Adagrad state ``(count,)``, both ``.npy``; written atomically, checked against the expected
shape from their headers before anything is allocated, read straight into preallocated
(possibly shared-memory) tensors, and carried into a new version by hard link."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from bigembed.atomic import atomic_file
from bigembed.checkpoints.layout import npy_header, write_error
from bigembed.errors import CheckpointError


def write_partition_files(
    directory: Path, emb_path: Path, state_path: Path, emb: torch.Tensor, state: torch.Tensor
) -> None:
    """Write both files (each atomically; ``directory`` is created if needed)."""
    for target, tensor in ((emb_path, emb), (state_path, state)):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with atomic_file(target) as tmp, open(tmp, "wb") as f:
                np.save(f, tensor.detach().numpy(), allow_pickle=False)
        except OSError as exc:
            raise write_error(target, exc) from None


def check_partition_files(emb_path: Path, state_path: Path, count: int, dim: int) -> None:
    """Check the files' headers against ``(count, dim)`` before allocating."""
    shape, _dtype = npy_header(emb_path)
    if shape != (count, dim):
        raise CheckpointError(
            f"{emb_path}: shape {shape} does not match the entity count and dimension "
            f"{(count, dim)} (was the graph re-imported or the dimension changed?)"
        )
    if state_path.exists():
        sshape, _ = npy_header(state_path)
        if sshape != (count,):
            raise CheckpointError(
                f"{state_path}: shape {sshape} does not match the entity count {count}"
            )


def read_partition_files(
    emb_path: Path,
    state_path: Path,
    version: int,
    out_emb: torch.Tensor,
    out_state: torch.Tensor,
    *,
    require_state: bool = False,
) -> None:
    """Read both files into ``out_emb`` and ``out_state``.

    ``require_state``: the optimizer file must be there (a committed checkpoint of this run);
    otherwise a missing one leaves the state at zero (a warm start).
    """
    if require_state and not state_path.exists():
        raise CheckpointError(
            f"{state_path}: missing from checkpoint version {version} (its optimizer state "
            "would be lost); restore the file or train into a new checkpoint_path"
        )
    try:
        emb = np.load(emb_path, mmap_mode="c", allow_pickle=False)
        state = (
            np.load(state_path, mmap_mode="c", allow_pickle=False) if state_path.exists() else None
        )
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{emb_path}: cannot read partition: {exc}") from None
    if tuple(emb.shape) != tuple(out_emb.shape):
        raise CheckpointError(
            f"{emb_path}: shape {tuple(emb.shape)} does not match the entity count and dimension "
            f"{tuple(out_emb.shape)} (was the graph re-imported or the dimension changed?)"
        )
    if require_state and (state is None or state.shape != (out_emb.shape[0],)):
        raise CheckpointError(
            f"{state_path}: shape {None if state is None else state.shape} does not match "
            f"the entity count {out_emb.shape[0]}"
        )
    out_emb.copy_(torch.from_numpy(emb))
    if state is not None and state.shape == (out_emb.shape[0],):
        out_state.copy_(torch.from_numpy(state))
    else:
        out_state.zero_()


def link_file(src: Path, dst: Path) -> None:
    """Carry ``src`` to ``dst`` without copying (a hard link; a copy renamed into place where
    links are not possible); nothing when ``src`` is missing or ``dst`` exists."""
    if src.exists() and not dst.exists():
        try:
            os.link(src, dst)
        except OSError:
            tmp = dst.with_name(f".{dst.name}.tmp")
            try:
                shutil.copyfile(src, tmp)
                os.replace(tmp, dst)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise write_error(dst, exc) from None
