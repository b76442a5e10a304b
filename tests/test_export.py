"""Runs ``tests/export_cases.py`` (``neobert-embed export`` and the light runtime) in a fresh interpreter.

Why a separate process: see that file's docstring (OpenVINO's runtime and a later SIGINT in the same
pytest process). Its output is shown when a case fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("export_cases.py")


def test_export_cases_pass_in_their_own_process():
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                            cwd=CASES.parent.parent, capture_output=True, text=True, timeout=1200,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]  # 0: every case passed or skipped
