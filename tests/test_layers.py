"""The package's layering, as imports: reading and checking a config pulls in no training code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_importing_config_imports_no_engine_module():
    code = ("import sys, json, accordion_repro.config; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('accordion_repro'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    loaded = json.loads(out)
    assert "accordion_repro.config" in loaded
    assert not [m for m in loaded if m.startswith(("accordion_repro.engine", "accordion_repro.launch"))], loaded
