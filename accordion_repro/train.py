"""Entry point: `python -m accordion_repro.train model=resnet18 compressor=powersgd schedule=accordion`.

Hydra composes and this module validates once, before any rank starts; the resolved config is
written to the run directory and handed to the ranks as plain data. The run directory's name
comes from the preset, the overrides and the seed (conf/config.yaml), never from the clock, so a
requeued or resumed job finds its own checkpoint.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from accordion_repro import config as config_module
from accordion_repro.errors import ConfigError, DatasetMissingError
from accordion_repro.launch import RankFailed, env_world_size, launch
from accordion_repro.utils import atomic_write_text

log = logging.getLogger("accordion_repro")


def run(cfg: DictConfig, run_dir: Path) -> Path:
    """Validate, write resolved.yaml, start the ranks. Usable without Hydra (tests, scripts)."""
    config_module.validate(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    if (env_world_size() is None) or int(__import__("os").environ.get("RANK", "0")) == 0:
        atomic_write_text(run_dir / "resolved.yaml", OmegaConf.to_yaml(OmegaConf.create(resolved)))
    launch(resolved, run_dir)
    return run_dir


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, run_dir)
    except (ConfigError, DatasetMissingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except RankFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"run directory: {run_dir}")


if __name__ == "__main__":
    main()
