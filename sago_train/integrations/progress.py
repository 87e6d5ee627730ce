"""Progress that survives a log file: a bar (tqdm, rich) draws nothing when stderr is not a terminal, so an
evaluation of minutes would be silent in ``nohup``/SLURM/CI logs. :class:`SetProgress` counts the sequences an
evaluation reports and writes one line per finished set, with the elapsed time."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import distributed


def stderr_is_terminal() -> bool:
    """Whether a progress bar on stderr would be seen (False for log files and pipes)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class SetProgress:
    """A ``progress(n)`` callable for :meth:`SAGOEvaluator.evaluate`: ``counts`` is the number of sequences of
    each set, in evaluation order; ``say`` receives one line per finished set, e.g.
    ``sago step 10: set 'paraphrase' done (1/2 sets, 96/160 sequences, 12.3 s)``."""

    def __init__(self, counts: Mapping[str, int], say: Callable[[str], None], label: str = "sago") -> None:
        self.counts = dict(counts)
        self.total = sum(self.counts.values())
        self.say = say
        self.label = label
        self.done = 0
        self._next = 0  # index of the next set to finish
        self._ends = []
        acc = 0
        for n in self.counts.values():
            acc += n
            self._ends.append(acc)
        self._start = time.perf_counter()

    def __call__(self, n: int) -> None:
        self.done += n
        names = list(self.counts)
        while self._next < len(names) and self.done >= self._ends[self._next]:
            seconds = time.perf_counter() - self._start
            self.say(f"{self.label}: set '{names[self._next]}' done ({self._next + 1}/{len(names)} sets, "
                     f"{self._ends[self._next]}/{self.total} sequences, {seconds:.1f} s)")
            self._next += 1


def ensure_console(level: int) -> None:
    """Show ``sago_train``'s log lines (the cost line, per-set progress) on stderr when nobody configured logging:
    Python drops INFO lines otherwise. Does nothing when the application (or pytest) has set up a handler."""
    import logging

    lib = logging.getLogger("sago_train")
    if lib.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    lib.addHandler(handler)
    lib.setLevel(level)
    lib.propagate = False  # root has no handler now; if one is added later, lines would otherwise print twice


def planned_evaluations(*, max_steps: int, start_step: int, eval_steps: int | None, trainer_strategy: str,
                        trainer_eval_steps: float | None, epochs: float, at_end: bool) -> int | None:
    """How many evaluations after the baseline the chosen cadence will run up to ``max_steps``; None for the
    automatic cadence (bounded by its overhead budget instead) or an unknown length."""
    if max_steps <= 0:
        return None
    if eval_steps is not None:
        every = eval_steps
    elif trainer_strategy == "steps" and trainer_eval_steps:
        every = max(1, round(trainer_eval_steps * max_steps)) if trainer_eval_steps < 1 else int(trainer_eval_steps)
    elif trainer_strategy == "epoch":
        return max(1, round(epochs))
    else:
        return None
    n = max_steps // every - start_step // every
    return n + int(at_end and max_steps % every != 0)


def planned_complete(n: int, done: int, every: int) -> int:
    """How many of the ``n`` evaluations after the ``done`` ones are complete (with generation): every
    ``every``-th counted from the first evaluation, and the last one (the final evaluation) always."""
    full = sum(1 for i in range(done, done + n) if i % every == 0)
    return full + int(n > 0 and (done + n - 1) % every != 0)


def _split(n: int, n_full: int) -> str:
    return "" if n_full >= n else f" ({n_full} complete, {n - n_full} without generation)"


def _ordinal(n: int) -> str:
    """2 -> '2nd', 11 -> '11th', 23 -> '23rd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def cost_line(seconds: float, n: int | None, max_steps: int, budget: float, *, n_full: int | None = None,
              generation_every: int = 1) -> str:
    """The line after the baseline: one (complete) evaluation's time and the cadence's planned total (``n``
    evaluations, ``n_full`` of them complete; None: the automatic cadence, bounded by ``budget``). Evaluations
    without generation are counted at the complete one's cost until one is measured: an upper bound."""
    every = "" if generation_every == 1 else (f"; generation-based axes at every {_ordinal(generation_every)} evaluation "
                                              "only, the others cost less")
    if n is None:
        return (f"sago: one evaluation took {seconds:.1f} s (the baseline, a one-off set-up cost); the automatic "
                f"cadence keeps later evaluations, the final one included, within {100 * budget:.0f}% of training "
                f"time{every}")
    n_full = n if n_full is None else n_full
    bound = "about" if n_full >= n else "at most"
    return (f"sago: one evaluation took {seconds:.1f} s; the cadence plans {n} more up to step {max_steps}"
            f"{_split(n, n_full)}: {bound} {n * seconds:.0f} s (the share of training time follows once a few "
            f"steps are timed)")


def partial_cost_line(seconds: float, full_s: float | None, every: int) -> str:
    """The line after the first evaluation without generation: its cost against a complete one's."""
    ratio = f" ({100 * seconds / full_s:.0f}% of a complete one, {full_s:.1f} s)" if full_s else ""
    return (f"sago: an evaluation without generation-based axes took {seconds:.1f} s{ratio}; they are computed at "
            f"every {_ordinal(every)} evaluation (and at the final one)")


def share_line(step_s: float, steps_timed: int, steps: int, n: int, seconds: float, *, n_full: int | None = None,
               partial_s: float | None = None) -> str:
    """The line once a few steps are timed: estimated training time and the planned evaluations' share of it
    (evaluations without generation at ``partial_s``, else at the complete one's ``seconds``: an upper bound)."""
    train_s = step_s * steps
    n_full = n if n_full is None else n_full
    total = n_full * seconds + (n - n_full) * (seconds if partial_s is None else partial_s)
    bound = "at most " if n_full < n and partial_s is None else ""
    return (f"sago: at {step_s:.2f} s per training step ({steps_timed} steps timed), training takes about "
            f"{train_s:.0f} s; the {n} planned evaluations{_split(n, n_full)} take {bound}{total:.0f} s, "
            f"{bound}{100 * total / train_s:.0f}% of it")


def auto_share_line(step_s: float, steps_timed: int, steps: int, final_s: float, budget: float) -> str:
    """The automatic cadence's line once a few steps are timed: whether the final evaluation (at the
    baseline's cost) fits the budget, i.e. whether any periodic evaluation can run."""
    train_s = step_s * steps
    head = (f"sago: at {step_s:.2f} s per training step ({steps_timed} steps timed), training takes about "
            f"{train_s:.0f} s; ")
    share = final_s / train_s
    if share > budget:
        return (head + f"the final evaluation alone (about {final_s:.0f} s) is {100 * share:.0f}% of it, over the "
                f"{100 * budget:.0f}% budget, so no periodic evaluation will run (eval_steps sets a cadence; a "
                "lower max_groups or max_new_tokens makes evaluations cheaper)")
    tail = (head + f"evaluations after the baseline will take at most {100 * budget:.0f}% of it (about "
            f"{budget * train_s:.0f} s): the final one (about {final_s:.0f} s)")
    # A periodic evaluation is earned once the budget of the training so far covers it and the final one; with a
    # complete evaluation's cost as the bound (the only cost measured yet) that is 2 * final / budget.
    first_s = 2 * final_s / budget
    if first_s > train_s:
        return tail + f"; a periodic one would need about {first_s:.0f} s of training, so none is expected"
    return tail + f" and periodic ones while they fit (the first after about {first_s:.0f} s of training at most)"


def evaluation_progress(evaluator: Any, sets: Mapping[str, Any], step: int, *, disable_bar: bool,
                        say: Callable[[str], None], generation: bool = True
                        ) -> tuple[Callable[[int], None] | None, Any]:
    """``(progress callable, bar to close)`` for one evaluation on the main process: a tqdm bar on a
    terminal, one line per finished set (:class:`SetProgress`) in a log file, nothing on other ranks."""
    if not distributed.is_main_process():
        return None, None
    if not stderr_is_terminal():  # a log file: a bar would draw nothing there
        counts = {name: evaluator.count_sequences({name: vs}, generation) for name, vs in sets.items()}
        return SetProgress(counts, say, label=f"sago step {step}"), None
    if disable_bar:
        return None, None
    from tqdm.auto import tqdm

    bar = tqdm(total=evaluator.count_sequences(sets, generation), desc="SAGO eval", leave=False, dynamic_ncols=True)
    return bar.update, bar
