"""pyproject.toml's torch/torchvision ranges against the APIs the code relies on, and the pins."""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib

import pytest
import torch
import torchvision

from accordion_repro.torch_apis import (TORCH_APIS, TORCHVISION_APIS, TORCHVISION_FOR_TORCH,
                                        oldest_torch, version_tuple)
from conftest import REPO


def _declared() -> dict[str, str]:
    """{name: the requirement's text after the name} for pyproject's dependencies, the suite
    extra's included."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["suite"]
    return {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower(): d for d in deps}


def _lower_bound(requirement: str) -> str:
    found = re.fullmatch(r"[A-Za-z0-9_.-]+\s*>=\s*([0-9.]+)", requirement.strip())
    assert found, f"{requirement!r}: declare a range `name>=X.Y` (no pin, no upper bound)"
    return found.group(1)


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_torch_and_torchvision_are_ranges_at_the_oldest_release_with_every_api():
    declared = _declared()
    torch_bound = _lower_bound(declared["torch"])
    assert version_tuple(torch_bound) == version_tuple(oldest_torch()), (
        f"pyproject says torch>={torch_bound}; the APIs in accordion_repro/torch_apis.py need "
        f"torch>={oldest_torch()} and nothing older")
    assert _lower_bound(declared["torchvision"]) == TORCHVISION_FOR_TORCH[oldest_torch()]


@pytest.mark.parametrize("entry", TORCH_APIS, ids=[a.api for a in TORCH_APIS])
def test_each_listed_api_exists_here_and_is_used_where_the_list_says(entry):
    obj = _resolve(entry.api)
    if entry.keyword is not None:
        assert entry.keyword in inspect.signature(obj).parameters
    assert version_tuple(entry.added) <= version_tuple(torch.__version__)
    assert entry.marker in (REPO / entry.used_in).read_text(), (
        f"{entry.used_in} no longer shows {entry.marker!r}: update accordion_repro/torch_apis.py")


def test_an_optional_path_states_its_own_oldest_torch_in_its_doc():
    features = {a.feature for a in TORCH_APIS} - {None}
    assert features == {"fsdp"}
    newer = oldest_torch("fsdp")
    assert version_tuple(newer) > version_tuple(oldest_torch())
    assert f"torch >= {newer}" in (REPO / "docs" / "fsdp.md").read_text()


def test_torchvision_apis_exist():
    for dotted in TORCHVISION_APIS:
        _resolve(dotted)
    assert torchvision.__version__


def test_the_tested_versions_are_pinned_in_constraints_and_used_by_make_install_and_ci():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not a pin (name==version)"
            pins[name.strip().lower()] = version.strip()
    # every dependency (and test extra) has its tested version pinned, inside the declared range
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower()
             for d in project["dependencies"] + project["optional-dependencies"]["suite"]
             + project["optional-dependencies"]["test"]]
    assert sorted(set(names) - set(pins)) == []
    for name in ("torch", "torchvision"):
        assert version_tuple(pins[name]) >= version_tuple(_lower_bound(_declared()[name]))
    assert pins["torch"] == torch.__version__.split("+")[0]
    makefile = (REPO / "Makefile").read_text()
    assert "-m pip install --quiet -c constraints.txt uv\n" in makefile
    assert "uv pip install --quiet --python $(PYTHON) \\\n\t\t-c constraints.txt -e '.[suite,test]'" in makefile
    assert "make test" in (REPO / ".ci" / "run").read_text()  # CI runs through $(STAMP)


def test_version_tuple_drops_local_and_prerelease_tags():
    assert version_tuple("2.14.1+cu130") == (2, 14, 1)
    assert version_tuple("2.11.0a0+git123") == (2, 11, 0)
    assert version_tuple("2.1") == (2, 1)
