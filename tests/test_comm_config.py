"""Bad compressor options stop before launch with a ConfigError naming the key."""

import pytest
import torch

from accordion_repro.comm import build_reducer, level_kind, validate_compressor
from accordion_repro.errors import ConfigError


@pytest.mark.parametrize("name,options,key", [
    ("powersgd", {"rank": 0}, "compressor.rank"),
    ("powersgd", {"rank": 1.5}, "compressor.rank"),
    ("powersgd", {"rank": True}, "compressor.rank"),
    ("powersgd", {}, "compressor.rank"),
    ("powersgd", {"rank": 2, "seed": -1}, "compressor.seed"),
    ("powersgd", {"rank": 2, "warm_start": "yes"}, "compressor.warm_start"),
    ("powersgd", {"rank": 2, "ratio": 0.1}, "compressor.ratio"),
    ("topk", {"ratio": 0.0}, "compressor.ratio"),
    ("topk", {"ratio": 1.5}, "compressor.ratio"),
    ("topk", {"ratio": 0.1, "rank": 2}, "compressor.rank"),
    ("topk", {"ratio": 0.1, "official_topk": 1}, "compressor.official_topk"),
    ("none", {"rank": 2}, "compressor.rank"),
    ("qsgd", {}, "compressor.name"),
])
def test_bad_options_name_the_key(name, options, key):
    with pytest.raises(ConfigError) as error:
        validate_compressor(name, options)
    assert error.value.key == key
    with pytest.raises(ConfigError):
        build_reducer(name, [torch.zeros(2, 2)], **options)


def test_bad_level_at_step_time_names_the_key():
    reducer = build_reducer("powersgd", [torch.zeros(4, 4)], rank=2)
    with pytest.raises(ConfigError, match="compressor.rank"):
        reducer.reduce([torch.zeros(4, 4)], [0])
    topk = build_reducer("topk", [torch.zeros(4, 4)], ratio=0.5)
    with pytest.raises(ConfigError, match="compressor.ratio"):
        topk.set_levels([2.0])


def test_level_kind():
    assert level_kind("powersgd") is int and level_kind("topk") is float
    assert level_kind("none") is None
    with pytest.raises(ConfigError, match="compressor.name"):
        level_kind("bogus")


def test_the_shipped_yaml_builds_valid_reducers():
    from pathlib import Path

    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "conf" / "compressor"
    import accordion_repro.config  # noqa: F401  (registers conf/'s resolvers)

    for name in ("none", "powersgd", "topk"):
        for schedule in ("static", "accordion"):
            node = OmegaConf.merge({"seed": 3, "schedule": {"name": schedule}},
                                   {"c": OmegaConf.load(conf / f"{name}.yaml")})
            options = OmegaConf.to_container(node.c, resolve=True)
            assert options.pop("name") == name
            validate_compressor(name, options)
            reducer = build_reducer(name, [torch.zeros(3, 3)], **options)
            # under a schedule that sets every layer's level the compressor has none of its own
            assert (reducer.default_level is None) == (name == "none" or schedule == "accordion")
