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
from accordion_repro.data import prepare_dataset
from accordion_repro.errors import ConfigError, DatasetMissingError
from accordion_repro.launch import RankFailed, env_rank, launch
from accordion_repro.utils import atomic_write_text

log = logging.getLogger("accordion_repro")


def run(cfg: DictConfig, run_dir: Path) -> Path:
    """Validate, write resolved.yaml, start the ranks. Usable without Hydra (tests, scripts)."""
    config_module.validate(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    if env_rank() == 0:
        atomic_write_text(run_dir / "resolved.yaml", OmegaConf.to_yaml(OmegaConf.create(resolved)))
        prepare_dataset(resolved["dataset"])
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


def expand_experiment_globs(argv: list[str]) -> list[str]:
    """`experiment=glob(table1/*)` over the nested preset folders.

    Hydra's glob() sees only the top level of a config group, while the presets sit one folder
    down (experiment/table1/...), so the sweep list is expanded here, before Hydra parses it.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    presets_dir = Path(__file__).resolve().parent.parent / "conf" / "experiment"
    names = sorted(p.relative_to(presets_dir).with_suffix("").as_posix() for p in presets_dir.rglob("*.yaml"))
    out = []
    for arg in argv:
        if arg.lstrip("+~").startswith("experiment=") and "glob(" in arg:
            override = OverridesParser.create().parse_override(arg)
            value = override.value()
            if isinstance(value, Glob):
                chosen = value.filter(names)
                if not chosen:
                    raise ConfigError("experiment", f"{arg!r} matches no preset under {presets_dir}")
                arg = f"{override.get_key_element()}={','.join(chosen)}"
        out.append(arg)
    return out


if __name__ == "__main__":
    try:
        sys.argv = expand_experiment_globs(sys.argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    main()
