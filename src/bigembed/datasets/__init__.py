"""Datasets bundled with bigembed (for the demo and the tests)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATASETS", "fb15k237_demo_config", "fb15k237_files"]

DATASETS = Path(__file__).resolve().parent


def fb15k237_files() -> dict[str, Path]:
    """FB15k-237 (Toutanova & Chen 2015): train/valid/test as gzip'd TSV (head, relation, tail)."""
    root = DATASETS / "fb15k237"
    return {split: root / f"{split}.txt.gz" for split in ("train", "valid", "test")}


def fb15k237_demo_config() -> Path:
    return DATASETS / "fb15k237" / "demo.yaml"
