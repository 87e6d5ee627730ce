"""One evaluation during training: progress lines that survive a log file, and the console set-up."""

from __future__ import annotations

import logging

from sago_train.integrations import measure
from sago_train.integrations.measure import SetProgress


def test_one_line_per_finished_set(monkeypatch):
    times = iter([100.0, 102.5, 110.0])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(times))
    lines: list[str] = []
    tick = SetProgress({"a": 6, "b": 4}, lines.append, label="sago step 0")
    for n in (3, 2):
        tick(n)
    assert lines == []
    tick(1)  # set a ends exactly at 6 sequences
    tick(4)
    assert lines == ["sago step 0: set 'a' done (1/2 sets, 6/10 sequences, 2.5 s)",
                     "sago step 0: set 'b' done (2/2 sets, 10/10 sequences, 10.0 s)"]


def test_console_only_when_logging_is_unconfigured(monkeypatch):
    lib = logging.getLogger("sago_train")
    monkeypatch.setattr(lib, "handlers", [])
    measure.ensure_console(logging.INFO)  # pytest has a root handler: nothing is added
    assert lib.handlers == []
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(lib, "propagate", True)
    monkeypatch.setattr(lib, "level", logging.NOTSET)
    measure.ensure_console(logging.INFO)
    assert len(lib.handlers) == 1 and lib.level == logging.INFO and lib.propagate is False

