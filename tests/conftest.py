"""Shared test helpers: compose configs through Hydra's compose API and run the real trainer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import accordion_repro.config  # noqa: F401  (registers the conf/ resolvers)

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
SHARED_DATA = REPO.parent / "shared" / "data"

torch.set_num_threads(1)
os.environ.setdefault("WANDB_SILENT", "true")


def compose_cfg(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train(overrides: list[str], run_dir: Path) -> Path:
    """Compose, validate and run the trainer exactly as the CLI does (spawning ranks if asked)."""
    from accordion_repro.train import run

    cfg = compose_cfg(["logger.wandb.mode=disabled", "trainer.progress=never", *overrides])
    return run(cfg, Path(run_dir))


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


@pytest.fixture(autouse=True, scope="session")
def _private_decode_cache(tmp_path_factory):
    """Tests decode JPEGs into their own cache, never into the user's ~/.cache."""
    os.environ["ACCORDION_CACHE_DIR"] = str(tmp_path_factory.mktemp("decode-cache"))
    yield


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real sample data not present at {SHARED_DATA}")
    return SHARED_DATA
