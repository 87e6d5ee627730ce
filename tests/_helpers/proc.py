"""Run a subprocess (torchrun, workers) so that a hang or timeout never leaves orphans behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
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


def run_together(cmds: list[list[str]], *, timeout: float = 300, **kwargs: Any) -> list[subprocess.CompletedProcess]:
    """:func:`run` for several commands at once (each in its own session, every one killed on timeout); their
    output goes through files, so that a chatty one never blocks on a full pipe while another is awaited."""
    with contextlib.ExitStack() as stack:
        files = [(stack.enter_context(tempfile.TemporaryFile("w+")), stack.enter_context(tempfile.TemporaryFile("w+")))
                 for _ in cmds]
        procs = [subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True, **kwargs)
                 for cmd, (out, err) in zip(cmds, files)]
        deadline = time.monotonic() + timeout
        try:
            for proc in procs:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            late = [" ".join(cmd) for cmd, proc in zip(cmds, procs) if proc.poll() is None]
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            raise AssertionError(f"timed out after {timeout} s: {late}") from None
        done = []
        for cmd, proc, (out, err) in zip(cmds, procs, files):
            out.seek(0)
            err.seek(0)
            done.append(subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read()))
    return done
