"""The walk of one evaluation through the package (issue #31): run a tiny monitored Trainer run with early
stopping, trace the second evaluation from ``SAGOCallback._evaluate`` to its return (``sys.setprofile``), and
print the package modules it entered, the moves between folders and how many of them climb back up (from a
lower layer to a higher one by ``RANK`` of ``tests/test_layering.py``).

The walk is the innermost package frame at every call and return: a move is a change of folder between two
successive places (a call down and its return both count), so ``moves = 2 x calls across folders`` for a
walk that never calls upwards, and a climb is a step up the layers (a return, or a callback duck-typed
upwards).

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/walk_evaluation.py [--modules]
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


def trace_one(target: int = 2, *, run: bool = False) -> list[str]:
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
    return walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", action="store_true", help="also list the modules entered, with their counts")
    parser.add_argument("--run", action="store_true", help="trace the evaluator's run too (forwards, axes)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    walk = trace_one(run=args.run)
    moves = [(a, b) for a, b in zip(walk, walk[1:]) if folder_of(a) != folder_of(b)]
    climbs = [(a, b) for a, b in moves if RANK.get(folder_of(b), 99) > RANK.get(folder_of(a), 99)]
    entered = Counter(walk)
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
