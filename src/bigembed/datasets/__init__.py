"""Datasets bundled with bigembed (for the quickstart, the demo and the tests)."""

from __future__ import annotations

import gzip
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUNDLED",
    "DATASETS",
    "BundledDataset",
    "fb15k237_demo_config",
    "fb15k237_files",
    "write_dataset",
]

DATASETS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class BundledDataset:
    """A dataset shipped inside the package: gzip'd TSV edge lists (head, relation, tail)."""

    name: str
    description: str
    splits: tuple[str, ...] = ("train", "valid", "test")

    def files(self) -> dict[str, Path]:
        """The packaged file of each split (``NAME/SPLIT.txt.gz``)."""
        return {split: DATASETS / self.name / f"{split}.txt.gz" for split in self.splits}


#: Every bundled dataset by name (what ``bigembed datasets list`` shows).
BUNDLED = {
    "fb15k237": BundledDataset(
        "fb15k237",
        "FB15k-237 (Toutanova & Chen 2015): 14,541 entities, 237 relations, "
        "272,115 / 17,535 / 20,466 train / valid / test edges",
    ),
}


def fb15k237_files() -> dict[str, Path]:
    """FB15k-237 (Toutanova & Chen 2015): train/valid/test as gzip'd TSV (head, relation, tail)."""
    return BUNDLED["fb15k237"].files()


def fb15k237_demo_config() -> Path:
    return DATASETS / "fb15k237" / "demo.yaml"


def write_dataset(dataset: BundledDataset, directory: Path) -> dict[str, Path]:
    """Write each split of ``dataset`` uncompressed as ``directory/SPLIT.txt`` (TSV)."""
    out = {}
    for split, packaged in dataset.files().items():
        target = directory / f"{split}.txt"
        with gzip.open(packaged, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        out[split] = target
    return out
