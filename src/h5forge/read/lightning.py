"""A LightningDataModule over one h5forge version: train/val/test/predict loaders that are right
under DDP (optional extra ``lightning``).

    from h5forge.read.lightning import H5DataModule
    dm = H5DataModule("data/demo/dataset_latest.h5", fields=("images", "masks"), batch_size=32, num_workers=2)
    trainer = lightning.pytorch.Trainer(strategy="ddp", devices=2)
    trainer.fit(model, datamodule=dm)

Each loader is the reader's own (``H5Dataset.loader``), whose sampler gives every rank an equal,
disjoint share and which Lightning does not shard again; the predict loader gives each rank every
world-th sample, so each is predicted once. Every rank reads the version rank 0 resolved in
``setup``. Importing Lightning loads Pillow: this module is only imported when asked for.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import lightning.pytorch as pl
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader

from h5forge.read._remote import version_of
from h5forge.read.torch import H5Dataset

__all__ = ["H5DataModule"]


class H5DataModule(pl.LightningDataModule):
    """Loaders for the splits of ``path`` (a version file or ``dataset_latest.h5``).

    ``fields`` and ``dataset_options`` go to every ``H5Dataset``, ``loader_options`` to every
    ``H5Dataset.loader``. Training batches are shuffled with ``seed``; validation and test batches
    come in stored order within each rank's equal share; each sample of ``predict_split`` is
    predicted once.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        fields: Sequence[str] | str | None = None,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        predict_split: str = "test",
        loader_options: dict[str, Any] | None = None,
        **dataset_options: Any,
    ):
        super().__init__()
        self.path = os.fspath(path)
        self.fields, self.batch_size, self.num_workers, self.seed = fields, batch_size, num_workers, seed
        self.predict_split = predict_split
        self.loader_options = dict(loader_options or {})
        self.dataset_options = dataset_options
        self.version_path: str | None = None  # the file every rank reads, fixed in setup()
        self._datasets: dict[str, H5Dataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.version_path is None:
            real = version_of(self.path, self.dataset_options.get("storage_options"))
            trainer = self.trainer
            self.version_path = trainer.strategy.broadcast(real, src=0) if trainer is not None else real

    def dataset(self, split: str) -> H5Dataset:
        """The split's ``H5Dataset`` (opened once per process)."""
        if split not in self._datasets:
            self.setup()
            assert self.version_path is not None  # setup() resolved it
            self._datasets[split] = H5Dataset(self.version_path, split, self.fields, **self.dataset_options)
        return self._datasets[split]

    def _loader(self, split: str, **options: Any) -> DataLoader:
        return self.dataset(split).loader(
            self.batch_size, num_workers=self.num_workers, **{**self.loader_options, **options}
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True, seed=self.seed)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        # every sample predicted once: rank r takes rows r, r + world, ... (no padding, no drop)
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        ds = self.dataset(self.predict_split)
        return self._loader(
            self.predict_split, sampler=UnrepeatedDistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
        )

    def teardown(self, stage: str | None = None) -> None:
        for ds in self._datasets.values():
            ds.close()
        self._datasets.clear()
