"""scikit-learn's handwritten digits (1,797 real samples) as a class-folder tree of PNGs:
init -> build -> H5Dataset(fields=("images", "label")) through 2 shuffled workers -> one epoch
of a linear model. Validation accuracy >= 0.8 (chance is 0.1) shows that labels and pixels stay
aligned through shuffling, workers and splits."""

from __future__ import annotations

import numpy as np
import torch
import yaml
from PIL import Image
from sklearn.datasets import load_digits

from h5forge._init import infer_spec
from h5forge.read.torch import H5Dataset
from h5forge.spec import parse_spec


def test_digits_train_a_linear_model_through_the_reader(tmp_path, build_spec):
    digits = load_digits()
    root = tmp_path / "digits"
    for i, (pixels, target) in enumerate(zip(digits.images, digits.target)):
        folder = root / str(target)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((pixels * 16).clip(0, 255).astype(np.uint8)).save(folder / f"{i:04d}.png")
    spec_path = tmp_path / "digits.yaml"
    inferred = infer_spec(root, spec_path)
    assert inferred.layout == "classify"
    data = yaml.safe_load(inferred.text)
    data["output"]["dir"] = str(tmp_path / "out")  # init's own choice is ./data/<name>, in the checkout
    spec = parse_spec(data, tmp_path, str(spec_path))
    assert spec.fields["label"].classes == tuple(str(k) for k in range(10))
    path, summary = build_spec(spec.model_dump(mode="json"))
    assert summary.samples == 1797 and summary.rejections == ()

    torch.manual_seed(0)
    train = H5Dataset(path, split="train", fields=("images", "label"))
    size = int(np.prod(train.info["images"].shape))
    model = torch.nn.Linear(size, 10)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for images, labels in train.loader(batch_size=32, num_workers=2, shuffle=True, seed=0):
        images = images.float() / 255  # uint8 as stored: converted where the model runs
        loss = torch.nn.functional.cross_entropy(model(images.reshape(len(images), -1)), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    val = H5Dataset(path, split="val", fields=("images", "label"))
    correct = total = 0
    with torch.no_grad():
        for images, labels in val.loader(batch_size=64, num_workers=2, shuffle=True, seed=1):
            images = images.float() / 255
            correct += int((model(images.reshape(len(images), -1)).argmax(1) == labels).sum())
            total += len(labels)
    assert total == len(val) > 100
    accuracy = correct / total
    print(f"digits: one epoch of a linear model, validation accuracy {accuracy:.3f} on {total} samples")
    assert accuracy >= 0.8
