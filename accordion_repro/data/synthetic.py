"""Offline stand-ins for CIFAR and WikiText-2, deterministic from a seed. Not real data.

They exist so the whole pipeline (and a learning curve that actually falls) can run where no
dataset may be downloaded. Nothing measured on them says anything about the paper's numbers.

Images: each class owns a random low-frequency colour template (a coarse random grid,
bilinearly upsampled to 32x32); an image is its class template plus a random low-frequency
nuisance field plus pixel noise. The nuisance makes classes overlap (a nearest-centroid
classifier gets about 90% on 10 classes and 60% on 100 at the default noise), so accuracy
climbs over epochs instead of saturating at once. Text: a random sparse Markov chain in which every token has only `branching`
possible successors, so a language model can push perplexity far below the vocabulary size.

The content depends on `data_seed` when given, else on the run seed, so a sweep over run seeds
can either share one data set or vary it.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
import torch.nn.functional as F

from .bundle import DataBundle, make_bundle
from .images import ArrayImageDataset, image_transforms
from .settings import SyntheticImageSettings, SyntheticTextSettings


def _data_seed(settings, seed: int) -> int:
    return int(seed if settings.data_seed is None else settings.data_seed)


def synthetic_images(num_classes: int, train_size: int, test_size: int, *, seed: int,
                     noise: float, pixel_noise: float, grid: int = 4,
                     pixel_std: float = 50.0):
    """uint8 (N, 32, 32, 3) train and test images with balanced, shuffled labels.

    image = template[label] + noise * (a random low-frequency field) + pixel_noise * white
    noise, in units of the template's standard deviation, then scaled to `pixel_std` grey
    levels around 128. The low-frequency nuisance lives in the same subspace as the templates,
    which is what makes the classes overlap (white noise alone averages away).
    """
    generator = torch.Generator().manual_seed(seed)

    def coarse_fields(count: int) -> torch.Tensor:
        coarse = torch.randn(count, 3, grid, grid, generator=generator)
        return F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)

    templates = coarse_fields(num_classes)
    field_std = templates.flatten(1).std(dim=1).mean()
    templates = templates / templates.flatten(1).std(dim=1).view(-1, 1, 1, 1)
    contrast = pixel_std / (1.0 + noise ** 2 + pixel_noise ** 2) ** 0.5

    def draw(count: int):
        labels = torch.arange(count) % num_classes
        labels = labels[torch.randperm(count, generator=generator)]
        signal = (templates[labels] + noise * coarse_fields(count) / field_std
                  + pixel_noise * torch.randn(count, 3, 32, 32, generator=generator))
        pixels = 128.0 + contrast * signal
        images = pixels.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        return images.contiguous().numpy(), labels.numpy()

    return draw(train_size), draw(test_size)


def build_images(s: SyntheticImageSettings, seed: int) -> DataBundle:
    (x_train, y_train), (x_test, y_test) = synthetic_images(
        s.num_classes, s.train_size, s.test_size, seed=_data_seed(s, seed), noise=s.noise,
        pixel_noise=s.pixel_noise)
    train_tf, test_tf = image_transforms(s)
    return make_bundle(s, ArrayImageDataset(x_train, y_train, train_tf),
                       ArrayImageDataset(x_test, y_test, test_tf), seed=seed,
                       num_classes=s.num_classes, notes="SYNTHETIC stand-in, not real data")


def markov_tokens(vocab_size: int, count: int, *, seed: int, branching: int) -> torch.Tensor:
    """A token stream from a random chain: each token has `branching` weighted successors."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab_size, size=(vocab_size, branching)).tolist()
    weights = rng.dirichlet(np.ones(branching), size=vocab_size).cumsum(axis=1)
    weights[:, -1] = 1.0
    cumulative = weights.tolist()
    draws = rng.random(count).tolist()
    token = int(rng.integers(vocab_size))
    stream = []
    for u in draws:
        row = cumulative[token]
        token = successors[token][bisect.bisect_right(row, u) if u < row[-1] else -1]
        stream.append(token)
    return torch.tensor(stream, dtype=torch.long)


def build_text(s: SyntheticTextSettings, seed: int) -> DataBundle:
    stream = markov_tokens(s.vocab_size, s.train_tokens + s.eval_tokens,
                           seed=_data_seed(s, seed), branching=s.branching)
    return make_bundle(s, stream[:s.train_tokens], stream[s.train_tokens:],
                       vocab_size=s.vocab_size,
                       notes=f"SYNTHETIC Markov chain, branching {s.branching}, not real text")
