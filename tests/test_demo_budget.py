"""`memwarden demo` with a budget the deployment cannot be served in: one clear error line."""

from __future__ import annotations

import subprocess
import sys


def test_demo_with_a_budget_too_small_prints_one_error_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memwarden",
            "demo",
            "--size",
            "tiny",
            "--budget",
            "1MiB",
            "--quiet",
            "-o",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--budget 1MiB" in errors[0] and "GovernedSession" in errors[0], proc.stderr
