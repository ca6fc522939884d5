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
from .bundle import DataBundle, make_bundle
from .settings import WikiTextSettings

SPLITS = ("train", "valid", "test")
NAMING_SCHEMES = ({s: f"{s}.txt" for s in SPLITS},
                  {s: f"wiki.{s}.tokens" for s in SPLITS})
EOS = "<eos>"


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


def check(settings: WikiTextSettings) -> dict[str, str]:
    """The split files (see split_files), once they are found usable."""
    files = split_files(settings.root)
    for split, path in files.items():
        if _is_empty(path):
            raise ConfigError("dataset.root", f"{path} is empty (no words): the {split} split of "
                                              f"WikiText-2 must hold text; copy the files again")
    return files


def _is_empty(path: str, probe: int = 1 << 16) -> bool:
    """No word at all: an empty file, or a short one of only whitespace."""
    with open(path, "rb") as handle:
        head = handle.read(probe)
    return not head.strip() and os.path.getsize(path) <= probe


def tokenize(paths: list[str], lowercase: bool = False) -> tuple[list[torch.Tensor], dict]:
    """Token ids of each file (whitespace tokens, `<eos>` closing every line), with one
    vocabulary grown across the files in order."""
    vocabulary: dict[str, int] = {}
    streams = []
    for path in paths:
        with open(path, encoding="utf8") as handle:
            words = [word for line in handle
                     for word in [*(line.lower() if lowercase else line).split(), EOS]]
        ids = [vocabulary.setdefault(word, len(vocabulary)) for word in words]
        streams.append(torch.tensor(ids, dtype=torch.long))
    return streams, vocabulary


def build(settings: WikiTextSettings, seed: int) -> DataBundle:
    files = check(settings)
    eval_split, lowercase = settings.eval_split, settings.lowercase
    streams, vocabulary = tokenize([files[s] for s in SPLITS], lowercase)
    by_split = dict(zip(SPLITS, streams))
    notes = f"eval on {eval_split}" + (", lower-cased" if lowercase else "")
    return make_bundle(settings, by_split["train"], by_split[eval_split],
                       vocab_size=len(vocabulary), notes=notes)
