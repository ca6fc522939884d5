"""WikiText-2 as a word-level token stream, tokenized like pytorch/examples word_language_model.

Each line is split on whitespace and closed with `<eos>` (blank lines give a lone `<eos>`);
one vocabulary is grown over train, valid and test in that order, so ids are the order of
first appearance and the usual tokenized files give 33,278 entries.

Difference from the official Accordion code: it read the raw text and tokenized it with spaCy,
lower-cased. We read the already tokenized `<unk>` release (train.txt/valid.txt/test.txt as in
word_language_model, or wiki.{train,valid,test}.tokens from the Salesforce zip) and keep case
unless `lowercase: true`, which lower-cases each line before splitting. Vocabulary size and
therefore perplexity are comparable in kind, not identical to the official runs.

The official "test" perplexity is measured on the validation split, hence `eval_split: valid`
by default; the bundle's `test` holds whichever split `eval_split` names.
"""

from __future__ import annotations

import os

import torch

from ..errors import ConfigError, DatasetMissingError
from .bundle import DataBundle
from .text import text_bundle

SPLITS = ("train", "valid", "test")
NAMING_SCHEMES = ({s: f"{s}.txt" for s in SPLITS},
                  {s: f"wiki.{s}.tokens" for s in SPLITS})
EOS = "<eos>"


def _root(cfg) -> str:
    return str(cfg.get("root", "data/wikitext-2"))


def split_files(root: str) -> dict[str, str]:
    """The three split files under root, in the first naming scheme that is complete."""
    for scheme in NAMING_SCHEMES:
        paths = {split: os.path.join(root, name) for split, name in scheme.items()}
        if all(os.path.isfile(p) for p in paths.values()):
            return paths
    expected = " or ".join("/".join(scheme.values()) for scheme in NAMING_SCHEMES)
    raise DatasetMissingError(
        f"WikiText-2 not found: expected {expected} in {os.path.abspath(root)}; copy the "
        f"word_language_model/data/wikitext-2 files of pytorch/examples there, or unzip "
        f"Salesforce's wikitext-2-v1.zip (https://s3.amazonaws.com/research.metamind.io/"
        f"wikitext/wikitext-2-v1.zip) into it")


def check(cfg) -> None:
    eval_split = cfg.get("eval_split", "valid")
    if eval_split not in ("valid", "test"):
        raise ConfigError("dataset.eval_split", f"must be 'valid' or 'test', got {eval_split!r}")
    for split, path in split_files(_root(cfg)).items():
        if _is_empty(path):
            raise ConfigError("dataset.root", f"{path} is empty (no words): the {split} split of "
                                              f"WikiText-2 must hold text; copy the files again")


def _is_empty(path: str, probe: int = 1 << 16) -> bool:
    """No word at all: an empty file, or a short one of only whitespace."""
    with open(path, "rb") as handle:
        head = handle.read(probe)
    return not head.strip() and os.path.getsize(path) <= probe


def read_words(path: str, lowercase: bool = False) -> list[str]:
    """Whitespace tokens of a file with `<eos>` closing every line."""
    words: list[str] = []
    with open(path, encoding="utf8") as handle:
        for line in handle:
            if lowercase:
                line = line.lower()
            words.extend(line.split())
            words.append(EOS)
    return words


def tokenize(paths: list[str], lowercase: bool = False) -> tuple[list[torch.Tensor], dict]:
    """Token ids of each file, with one vocabulary grown across the files in order."""
    vocabulary: dict[str, int] = {}
    add = vocabulary.setdefault
    streams = []
    for path in paths:
        ids = [add(word, len(vocabulary)) for word in read_words(path, lowercase)]
        streams.append(torch.tensor(ids, dtype=torch.long))
    return streams, vocabulary


def build(cfg, seed: int) -> DataBundle:
    check(cfg)
    files = split_files(_root(cfg))
    eval_split = cfg.get("eval_split", "valid")
    lowercase = bool(cfg.get("lowercase", False))
    streams, vocabulary = tokenize([files[s] for s in SPLITS], lowercase)
    by_split = dict(zip(SPLITS, streams))
    notes = f"eval on {eval_split}" + (", lower-cased" if lowercase else "")
    return text_bundle(cfg["name"], by_split["train"], by_split[eval_split],
                       vocab_size=len(vocabulary), subset=cfg.get("subset", None), notes=notes)
