"""Run a subprocess (torchrun, workers) so that a hang or timeout never leaves orphans behind."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
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


class Started:
    """A command started in the background (its own session; output through files, so that a chatty one never
    blocks on a full pipe), finished with :meth:`finish`; :meth:`kill` ends it and its children."""

    def __init__(self, cmd: list[str], **kwargs: Any) -> None:
        self.cmd = cmd
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=self.err, text=True, start_new_session=True,
                                     **kwargs)

    def finish(self, timeout: float) -> subprocess.CompletedProcess:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"timed out after {timeout} s: {' '.join(self.cmd)}") from None
        self.out.seek(0)
        self.err.seek(0)
        return subprocess.CompletedProcess(self.cmd, self.proc.returncode, self.out.read(), self.err.read())

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
