"""sago's console lines never share a line with a progress bar (the Trainer's tqdm bar, SAGO's own)."""

from __future__ import annotations

import io
import logging
import re

from tqdm import tqdm

from sago_train.integrations.measure import ProgressAwareHandler, ensure_console

LINE = "sago step 3, set 'paraphrase' vs the baseline (step 0): no significant change"


def _log_during_a_bar(handler_cls) -> str:
    buf = io.StringIO()
    bar = tqdm(total=10, file=buf, ascii=True, mininterval=0, miniters=1, desc="train")
    bar.update(3)
    handler = handler_cls(buf)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("sago_train.test_console_lines")
    log.addHandler(handler)
    log.propagate, log.level = False, logging.INFO
    try:
        log.info(LINE)
        bar.update(1)
    finally:
        log.removeHandler(handler)
        bar.close()
    return buf.getvalue()


def test_a_line_logged_during_a_bar_is_on_a_line_of_its_own():
    segments = re.split(r"[\r\n]", _log_during_a_bar(ProgressAwareHandler))
    assert LINE in segments  # cleared bar, the line, then the bar redrawn below it
    glued = re.split(r"[\r\n]", _log_during_a_bar(logging.StreamHandler))
    assert LINE not in glued and any(s.endswith(LINE) and s != LINE for s in glued)  # what a plain handler does


def test_the_console_sago_installs_is_progress_aware(monkeypatch):
    lib = logging.getLogger("sago_train")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(lib, "handlers", [])
    monkeypatch.setattr(lib, "propagate", lib.propagate)
    monkeypatch.setattr(lib, "level", lib.level)
    ensure_console(logging.INFO)
    (handler,) = lib.handlers
    assert isinstance(handler, ProgressAwareHandler)
