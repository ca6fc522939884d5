"""Each dataset's options (`dataset.*`), one default each, read before any rank starts.

The datasets are also built without Hydra (tests, scripts), so a default lives here and conf/
gets it through `_defaults/dataset/<name>` (config.py register_defaults); conf/dataset/ holds
only what ties to another key (`root: ${paths.data_dir}`) or what no default can know (a path).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import Options, Settings, is_int, is_real, option

PIPELINES = ("pil", "device")

# Official normalisation (facts section 5). CIFAR-10's is given in 0..255 units in the code.
CIFAR10_MEAN = tuple(v / 255.0 for v in (125.3, 123.0, 113.9))
CIFAR10_STD = tuple(v / 255.0 for v in (63.0, 62.1, 66.7))
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


def _subset(o: Options, key: str):
    """null, a fraction in (0, 1] or a count >= 1; one rule for images and text (bundle.py)."""
    subset = o.get(key)
    if subset is None:
        return None
    if not is_real(subset):
        raise o.error(key, f"{subset!r} is neither null, a fraction in (0, 1] nor a count")
    if is_int(subset) and subset < 1:
        raise o.error(key, f"count {subset} must be at least 1")
    if not is_int(subset) and not 0.0 < float(subset) <= 1.0:
        raise o.error(key, f"fraction {subset} must lie in (0, 1]; write a count as an integer")
    return subset


def _channels(o: Options, key: str) -> tuple[float, float, float]:
    values = tuple(float(v) for v in o.get(key))
    if len(values) != 3:
        raise o.error(key, f"needs 3 per-channel values, got {len(values)}")
    if key == "std" and min(values) <= 0:
        raise o.error(key, f"every entry must be positive, got {values}")
    return values


@dataclass(frozen=True, kw_only=True)
class DataSettings(Settings):
    SECTION = "dataset"
    name: str = option(Options.get, help="the dataset (its conf/dataset file)")
    # null | fraction in (0, 1] | count of training images (seeded) or a prefix of train tokens
    subset: int | float | None = option(
        _subset, default=None,
        help="null, a fraction in (0, 1] or a count of training images (seeded) or a prefix of "
             "train tokens")


@dataclass(frozen=True, kw_only=True)
class ImageSettings(DataSettings):
    augment: bool = option(
        Options.flag, default=True, on_resume="changeable",
        help="random crop (32, padding 4) and horizontal flip of training images")
    # pil: per-image PIL transforms (official) | device: the same augmentation on whole
    # batches on the rank's device (data/device_pipeline.py; for GPUs)
    pipeline: str = option(
        Options.choice, PIPELINES, default="pil", added="pil",
        help="pil: per-image transforms (official); device: the same augmentation on whole batches"
             " on the rank's device")
    rotation_degrees: float = option(
        Options.number, closed="low", default=0.0, on_resume="changeable",
        help="random rotation of training images, up to this many degrees")
    mean: tuple = option(_channels, default=CIFAR10_MEAN, help="per-channel normalisation mean")
    std: tuple = option(
        _channels, default=CIFAR10_STD,
        help="per-channel normalisation standard deviation")


@dataclass(frozen=True, kw_only=True)
class CifarSettings(ImageSettings):
    root: str = option(
        Options.get, on_resume="free",
        help="the folder that holds torchvision's python-version folder")
    download: bool = option(
        Options.flag, default=False, on_resume="free",
        help="let torchvision fetch the archive when it is missing")
    verify_checksums: bool = option(
        Options.flag, default=True,
        help="check the md5 of the official files")


@dataclass(frozen=True, kw_only=True)
class Cifar100Settings(CifarSettings):
    rotation_degrees: float = option(
        Options.number, closed="low", default=15.0, on_resume="changeable",
        help="random rotation of training images, up to this many degrees (the official "
             "CIFAR-100's 15)")
    mean: tuple = option(_channels, default=CIFAR100_MEAN, help="per-channel normalisation mean")
    std: tuple = option(
        _channels, default=CIFAR100_STD,
        help="per-channel normalisation standard deviation")


def _paths(o: Options, key: str) -> tuple[str, ...]:
    path = o.get(key)
    if path is None or (not isinstance(path, str) and len(path) == 0):
        raise o.error(key, "give an .npz file or a list of them")
    return (str(path),) if isinstance(path, str) else tuple(str(p) for p in path)


@dataclass(frozen=True, kw_only=True)
class NpzSettings(ImageSettings):
    path: tuple = option(_paths, help="one .npz file or a list of them (conf/dataset/npz.yaml)")
    num_classes: int = option(Options.integer, minimum=2, default=10, help="classes of the labels")
    cache_dir: str | None = option(
        Options.get, default=None, on_resume="free",
        help="where decoded JPEGs are cached (null: ~/.cache)")


@dataclass(frozen=True, kw_only=True)
class SyntheticImageSettings(ImageSettings):
    num_classes: int = option(
        Options.integer, minimum=2, default=10,
        help="classes of the synthetic images")
    train_size: int = option(Options.integer, default=2048, help="synthetic training images")
    test_size: int = option(Options.integer, default=512, help="synthetic test images")
    noise: float = option(
        Options.number, closed="low", default=2.0,
        help="noise around each class template, in template standard deviations")
    pixel_noise: float = option(
        Options.number, closed="low", default=0.3,
        help="independent noise per pixel, in the same units")
    data_seed: int | None = option(
        Options.integer, minimum=0, optional=True, default=None,
        help="seed of the generated data (null: the run's seed)")


@dataclass(frozen=True, kw_only=True)
class SyntheticImage100Settings(SyntheticImageSettings):
    num_classes: int = option(
        Options.integer, minimum=2, default=100,
        help="classes of the synthetic images")


@dataclass(frozen=True, kw_only=True)
class TextSettings(DataSettings):
    bptt: int = option(
        Options.integer, default=30,
        help="tokens per truncated back-propagation window")
    eval_batch_size: int = option(
        Options.integer, default=10,
        help="sequences evaluated side by side")


@dataclass(frozen=True, kw_only=True)
class WikiTextSettings(TextSettings):
    root: str = option(
        Options.get, on_resume="free",
        help="the folder that holds WikiText-2's token files")
    lowercase: bool = option(
        Options.flag, default=False,
        help="lower-case the text (the official code did)")
    # the official "test" perplexity is on the validation split
    eval_split: str = option(
        Options.choice, ("valid", "test"), default="valid",
        help="the split perplexity is reported on (the official 'test' perplexity is on valid)")


@dataclass(frozen=True, kw_only=True)
class SyntheticTextSettings(TextSettings):
    vocab_size: int = option(
        Options.integer, minimum=2, default=1000,
        help="tokens in the synthetic vocabulary")
    train_tokens: int = option(
        Options.integer, minimum=2, default=100_000,
        help="synthetic training tokens")
    eval_tokens: int = option(
        Options.integer, minimum=2, default=20_000,
        help="synthetic evaluation tokens")
    branching: int = option(
        Options.integer, default=4,
        help="successors per token of the random Markov chain")
    data_seed: int | None = option(
        Options.integer, minimum=0, optional=True, default=None,
        help="seed of the generated data (null: the run's seed)")
