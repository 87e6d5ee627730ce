"""Run a subprocess (torchrun, workers) so that a hang or timeout never leaves orphans behind."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def run(cmd: list[str], *, timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess:
    """Like ``subprocess.run(capture_output=True, text=True)``, in a new session whose whole process group
    is killed on timeout (torchrun's workers included)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s: {' '.join(cmd)}\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
