"""The walk of one evaluation through the package (issue #31): run a tiny monitored Trainer run with early
stopping, trace the second evaluation from ``SAGOCallback._evaluate`` to its return (``sys.setprofile``), and
print the package modules it entered, the moves between folders and how many of them climb back up (from a
lower layer to a higher one by ``RANK`` of ``tests/test_layering.py``).

Two walks. The *reader's walk* (the default) follows each call once, as a reader does who follows an
evaluation call by call: the dynamic call tree with every caller -> callee function pair expanded the first
time only (a loop's second group, a helper called again from the same place, adds nothing). The *raw walk*
(``--raw``) is the innermost package frame at every call and return, loops included. In both, a move is a
change of folder between two successive places (a call down and its return both count), so ``moves = 2 x
calls across folders`` for a walk that never calls upwards, and a climb is a step up the layers (a return,
or a callback duck-typed upwards); a module is *entered* each time the walk comes into it.

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/walk_evaluation.py [--modules] [--raw] [--run]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sago_train  # noqa: E402
from sago_train import SAGOCallback, SAGOEarlyStoppingCallback  # noqa: E402
from tests._helpers.trainer import make_trainer, variant_set  # noqa: E402
from tests.test_layering import RANK  # noqa: E402

PACKAGE = Path(sago_train.__file__).resolve().parent


def module_of(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    return ".".join(rel.with_suffix("").parts)


def folder_of(module: str) -> str:
    return module.split(".")[0]


class ReaderWalk:
    """The reader's walk (see the module doc), fed by ``sys.setprofile`` events."""

    def __init__(self) -> None:
        self.walk: list[str] = []
        self.stack: list[tuple[object, tuple | None, tuple | None, bool, bool]] = []
        self.seen: set[tuple] = set()

    def _place(self, module: str) -> None:
        if not self.walk or self.walk[-1] != module:
            self.walk.append(module)

    def __call__(self, frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event == "call":
            parent = self.stack[-1] if self.stack else (None, None, None, False, False)
            module = module_of(frame.f_code.co_filename)
            key = (module, frame.f_code.co_name, frame.f_code.co_firstlineno) if module else None
            ctx, skipping, recorded = parent[2], parent[3], False
            if key is not None and not skipping:
                edge = (ctx, key)
                if edge in self.seen:
                    skipping = True
                else:
                    self.seen.add(edge)
                    self._place(module)
                    recorded = True
            self.stack.append((frame, key, key or ctx, skipping, recorded))
        elif event == "return":
            while self.stack:
                entry = self.stack.pop()
                if entry[0] is frame:
                    break
            if entry[4] and self.stack and self.stack[-1][2] is not None:
                self._place(self.stack[-1][2][0])


def trace_one(target: int = 2, *, run: bool = False, raw: bool = False) -> list[str]:
    """The innermost package module after every call and return of evaluation number ``target``; without
    ``run``, what happens inside the evaluator's run (``SAGOCallback._run_evaluator``: the model's forwards and
    the axes) is left out, which leaves the comparing, recording, reporting and the listeners."""
    walk: list[str] = []
    calls = {"n": 0}
    original, original_run = SAGOCallback._evaluate, SAGOCallback._run_evaluator

    def profile(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event not in ("call", "return"):
            return
        f = frame if event == "call" else frame.f_back
        while f is not None:
            module = module_of(f.f_code.co_filename)
            if module is not None:
                if not walk or walk[-1] != module:
                    walk.append(module)
                return
            f = f.f_back

    reader = ReaderWalk()
    if not raw:
        profile = reader  # noqa: F811 - the reader's walk replaces the raw one

    def traced(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        calls["n"] += 1
        if calls["n"] != target:
            return original(self, *args, **kwargs)
        sys.setprofile(profile)
        try:
            return original(self, *args, **kwargs)
        finally:
            sys.setprofile(None)

    def untraced_run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        tracing = sys.getprofile() is profile
        sys.setprofile(None)
        try:
            return original_run(self, *args, **kwargs)
        finally:
            if tracing:
                sys.setprofile(profile)

    SAGOCallback._evaluate = traced
    if not run:
        SAGOCallback._run_evaluator = untraced_run
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cb = SAGOCallback(variant_set(n=8), eval_steps=2, max_groups=0, n_bootstrap=100,
                              axes="activation,activation_rel,confidence,generation", generation_every=1,
                              max_new_tokens=8)
            stop = SAGOEarlyStoppingCallback("sago/num/activation,sago/num/accuracy", patience=1)
            tr = make_trainer(tmp, callbacks=[cb, stop], max_steps=4)
            cb.add_listener(stop)
            tr.train()
    finally:
        SAGOCallback._evaluate, SAGOCallback._run_evaluator = original, original_run
    return walk if raw else reader.walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", action="store_true", help="also list the modules entered, with their counts")
    parser.add_argument("--run", action="store_true", help="trace the evaluator's run too (forwards, axes)")
    parser.add_argument("--raw", action="store_true", help="the raw walk (every call and return, loops included)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    walk = trace_one(run=args.run, raw=args.raw)
    moves = [(a, b) for a, b in zip(walk, walk[1:]) if folder_of(a) != folder_of(b)]
    climbs = [(a, b) for a, b in moves if RANK.get(folder_of(b), 99) > RANK.get(folder_of(a), 99)]
    entered = Counter(walk)  # each time the walk comes into a module (successive places are distinct)
    folders = sorted({folder_of(m) for m in entered}, key=lambda f: RANK.get(f, 99))
    print(f"modules entered: {len(entered)} in {len(folders)} folders ({', '.join(folders)})")
    print(f"moves between folders: {len(moves)}, climbs back up: {len(climbs)}")
    print(f"distinct moves between folders (module -> module): {len(set(moves))}, of them climbs: "
          f"{len(set(climbs))}")
    if args.modules:
        for module, n in entered.most_common():
            print(f"  {n:4d}  {module}")


if __name__ == "__main__":
    main()
