"""The official runs' final numbers, to print beside ours.

The paper's own table numbers could not be retrieved; official_results.csv holds the final
metrics parsed from the official repository's raw logs (github.com/uw-mad-dash/Accordion,
raw_data_files/), one run per cell. Lines starting with '#' are provenance comments.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

OFFICIAL_CSV = Path(__file__).with_name("official_results.csv")


@lru_cache(maxsize=None)
def official_results(path: str = str(OFFICIAL_CSV)) -> dict[tuple[str, str, str, str], dict]:
    """(dataset, method family, model, setting) -> the CSV row (final, best, epochs, log, ...)."""
    with open(path, encoding="utf-8", newline="") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    table = {}
    for row in csv.DictReader(lines):
        key = (row["dataset"], row["method"], row["model"], row["setting"])
        table[key] = {**row, "final": float(row["final"]), "best": float(row["best"]),
                      "epochs": int(row["epochs"])}
    return table


def official_final(dataset: str, family: str, model: str, setting: str | None) -> float | None:
    """The official run's final metric for a table cell, or None where there is none (dense)."""
    if setting is None:
        return None
    row = official_results().get((dataset, family, model, setting))
    return None if row is None else row["final"]
