"""A real Lightning DDP run (CPU, gloo, 127.0.0.1) that records, per rank and epoch, which rows of
the version file each training and validation step saw. Lightning's DDP launcher starts the other
rank by running this script again.

    python lightning_ddp.py VERSION_FILE OUT_DIR loader|datamodule
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

path, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
EPOCHS, BATCH = 2, 4


class Counting(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[str, list[int]] = {"train": [], "val": [], "predict": []}

    def _step(self, stage: str, batch) -> torch.Tensor:
        images, rows = batch
        self.seen[stage].extend(rows.tolist())
        return self.layer(images.float().mean(dim=(1, 2, 3)).unsqueeze(1)).pow(2).mean()

    def training_step(self, batch, i):
        return self._step("train", batch)

    def validation_step(self, batch, i):
        self._step("val", batch)

    def predict_step(self, batch, i):
        self._step("predict", batch)

    def _record(self, stage: str) -> None:
        if self.trainer.sanity_checking:
            self.seen[stage] = []
            return
        epoch = "" if stage == "predict" else f"-epoch{self.current_epoch}"
        name = f"{stage}-rank{self.global_rank}{epoch}.json"
        (out / name).write_text(json.dumps(self.seen[stage]))
        self.seen[stage] = []

    def on_train_epoch_end(self):
        self._record("train")

    def on_validation_epoch_end(self):
        self._record("val")

    def on_predict_epoch_end(self):
        self._record("predict")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class PlainLoaders(Counting):
    """The loaders a user writes with the reader's own ``loader()``, Lightning's defaults left on."""

    def train_dataloader(self):
        from h5forge.read.torch import H5Dataset

        return H5Dataset(path, "train", fields=["images"], return_index=True).loader(batch_size=BATCH, seed=3)

    def val_dataloader(self):
        from h5forge.read.torch import H5Dataset

        return H5Dataset(path, "val", fields=["images"], return_index=True).loader(batch_size=BATCH, shuffle=False)


trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=EPOCHS, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
if mode == "loader":
    trainer.fit(PlainLoaders())
else:
    from h5forge.read.lightning import H5DataModule

    model = Counting()
    dm = H5DataModule(path, fields=["images"], return_index=True, batch_size=BATCH, seed=3)
    trainer.fit(model, datamodule=dm)
    trainer.predict(model, datamodule=dm, return_predictions=False)
