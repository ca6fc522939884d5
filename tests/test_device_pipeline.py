"""dataset.pipeline=device against the official PIL pipeline: the same distribution of crops,
flips and rotations, the same per-channel statistics, the same sampler order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from accordion_repro.data import DeviceImages, epoch_sampler, image_loader
from accordion_repro.data.images import ArrayImageDataset, image_transforms
from accordion_repro.data.settings import CIFAR10_MEAN, CIFAR10_STD, ImageSettings
from accordion_repro.errors import ConfigError

SAMPLES = 4000


def _coordinate_image() -> np.ndarray:
    """Red = 8 x row, green = 8 x column, blue = 255: every pixel says where it came from."""
    rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    return np.stack([rows * 8, cols * 8, np.full_like(rows, 255)], -1).astype(np.uint8)


def _official(augment=True, rotation=0.0):
    return image_transforms(ImageSettings(name="pixels", augment=augment,
                                          rotation_degrees=rotation))


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """Normalised (N, 3, 32, 32) back to 0..255 values."""
    mean = torch.tensor(CIFAR10_MEAN)[None, :, None, None]
    std = torch.tensor(CIFAR10_STD)[None, :, None, None]
    return ((x * std + mean) * 255).round()


def _where_from(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(top offset, left offset, flipped) of each crop of the coordinate image, from its
    centre pixels (inside the original image whatever the offset)."""
    p = _pixels(x)
    row = p[:, 0, 16, 16] / 8
    flipped = p[:, 1, 16, 17] < p[:, 1, 16, 16]
    col_left = torch.where(flipped, p[:, 1, 16, 16] / 8 - 15, p[:, 1, 16, 16] / 8 - 16)
    return ((row - 16 + 4).numpy().astype(int), (col_left + 4).numpy().astype(int),
            flipped.numpy())


def _pil_batch(dataset, n: int) -> torch.Tensor:
    return torch.stack([dataset[0][0] for _ in range(n)])


def _device_batch(dataset, n: int) -> torch.Tensor:
    return DeviceImages(dataset, torch.device("cpu")).batch(torch.zeros(n, dtype=torch.long))[0]


@pytest.mark.parametrize("pipeline", ["pil", "device"])
def test_crop_offsets_and_flips_are_uniform(pipeline):
    torch.manual_seed(0)
    train, _ = _official()
    dataset = ArrayImageDataset(_coordinate_image()[None], [0], train)
    x = (_pil_batch if pipeline == "pil" else _device_batch)(dataset, SAMPLES)
    top, left, flipped = _where_from(x)
    for offsets in (top, left):
        counts = np.bincount(offsets, minlength=9)
        assert len(counts) == 9 and offsets.min() == 0  # 0..8: padding 4 on each side
        expected = SAMPLES / 9
        chi2 = ((counts - expected) ** 2 / expected).sum()
        assert chi2 < 26.1, counts  # chi-square, 8 degrees of freedom, p = 0.001
    assert abs(flipped.mean() - 0.5) < 4 * np.sqrt(0.25 / SAMPLES)


def test_a_padded_border_is_zero_before_normalisation_in_both():
    torch.manual_seed(1)
    train, _ = _official()
    dataset = ArrayImageDataset(_coordinate_image()[None], [0], train)
    for x in (_pil_batch(dataset, 200), _device_batch(dataset, 200)):
        top, _, _ = _where_from(x)
        p = _pixels(x)
        for i in np.flatnonzero(top == 0)[:5]:  # 4 padded rows at the top
            assert (p[i, 2, :4] == 0).all() and p[i, 2, 4, 16] == 255


@pytest.mark.parametrize("rotation", [0.0, 15.0], ids=["crop_flip", "crop_flip_rotate"])
def test_per_channel_statistics_of_a_large_batch_agree(rotation):
    """Real-looking images (smooth random fields): the two pipelines' outputs have the same
    per-channel mean and std within 0.02 (normalised units) over 2,048 augmented images."""
    rng = np.random.default_rng(0)
    coarse = rng.integers(0, 256, size=(256, 4, 4, 3)).astype(np.uint8)
    images = np.stack([np.asarray(Image.fromarray(c).resize((32, 32), Image.BILINEAR)) for c in coarse])
    train, _ = _official(rotation=rotation)
    dataset = ArrayImageDataset(images, np.arange(256) % 10, train)
    torch.manual_seed(0)
    index = torch.arange(2048) % 256
    pil = torch.stack([dataset[int(i)][0] for i in index])
    device = DeviceImages(dataset, torch.device("cpu")).batch(index)[0]
    for stat in (lambda t: t.mean((0, 2, 3)), lambda t: t.std((0, 2, 3))):
        assert torch.allclose(stat(pil), stat(device), atol=0.02), (stat(pil), stat(device))


def test_the_test_split_is_normalised_identically():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(16, 32, 32, 3)).astype(np.uint8)
    _, test = _official()
    dataset = ArrayImageDataset(images, np.arange(16) % 10, test)
    pil = torch.stack([dataset[i][0] for i in range(16)])
    device = DeviceImages(dataset, torch.device("cpu")).batch(torch.arange(16))[0]
    assert torch.allclose(pil, device, atol=1e-6)


@pytest.mark.parametrize("reshuffle", [True, False], ids=["reshuffle", "official_no_reshuffle"])
def test_the_device_pipeline_walks_the_same_sampler_order(reshuffle):
    images = np.zeros((50, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(50)  # the label is the index
    dataset = torch.utils.data.Subset(ArrayImageDataset(images, labels, _official()[0]), list(range(5, 50)))
    for epoch in (0, 1):
        common = dict(rank=1, world_size=2, epoch=epoch, shuffle=True,
                      reshuffle_each_epoch=reshuffle, seed=3)
        pil = torch.cat([y for _, y in image_loader(dataset, batch_size=8, **common)])
        order = list(epoch_sampler(dataset, **common))
        device = torch.cat([y for _, y in DeviceImages(dataset, torch.device("cpu")).batches(order, 8)])
        assert torch.equal(pil, device)


def test_a_transform_it_cannot_reproduce_is_refused_by_name():
    from torchvision import transforms

    dataset = ArrayImageDataset(np.zeros((2, 32, 32, 3), np.uint8), [0, 1],
                                transforms.Compose([transforms.ColorJitter(0.1), transforms.ToTensor()]))
    with pytest.raises(ConfigError, match="dataset.pipeline: device cannot reproduce the transform ColorJitter"):
        DeviceImages(dataset, torch.device("cpu"))


def test_a_device_pipeline_run_resumes_to_the_same_metrics(tmp_path):
    """Its random draws come from the generator a checkpoint saves: stop and resume are exact."""
    from conftest import read_metrics, train

    base = ["model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10",
            "dataset.train_size=64", "dataset.test_size=32", "dataset.pipeline=device",
            "compressor=powersgd", "trainer.epochs=2", "trainer.batch_size=16",
            "trainer.eval_batch_size=16", "trainer.max_eval_steps=2"]
    whole = read_metrics(train(base, tmp_path / "whole"))
    train([*base, "trainer.stop_after_epoch=0"], tmp_path / "parts")
    parts = read_metrics(train(base, tmp_path / "parts"))
    timing = {"epoch_time_s", "compute_time_s", "comm_time_s"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in parts] == \
           [{k: v for k, v in r.items() if k not in timing} for r in whole]
