"""Worker for kill-and-resume tests: a monitored Trainer run that can SIGKILL itself at a chosen point.

    python -m tests.reliability_worker OUT [--resume] [--kill step:N | eval:N | write:N]

step:N  - killed at the end of optimizer step N (between evaluations, after the Trainer's own work at N-1)
eval:N  - killed inside the N-th SAGO evaluation (in the middle of the scoring forward)
write:N - killed inside the N-th atomic file write, after the temporary file is written, before it replaces
          the real one
"""

from __future__ import annotations

import argparse
import json
import os
import signal

from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from sago_train import SAGOCallback, SAGOEarlyStoppingCallback

from ._helpers.trainer import make_trainer, variant_set


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAtStep(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            die()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--kill", default=None)
    a = ap.parse_args()
    counters = {"eval": 0, "write": 0}
    extra = []
    if a.kill:
        kind, n = a.kill.split(":")
        n = int(n)
        if kind == "step":
            extra.append(KillAtStep(n))
        elif kind == "eval":
            from sago_train.eval import extraction

            real_score = extraction.Extractor.run

            def score(self, *args, **kwargs):
                counters["eval"] += 1
                if counters["eval"] == n:
                    die()
                return real_score(self, *args, **kwargs)

            extraction.Extractor.run = score
        elif kind == "write":
            from sago_train import io as sio

            real_replace = os.replace

            class _OS:
                def __getattr__(self, name):
                    return getattr(os, name)

                @staticmethod
                def replace(src, dst):
                    counters["write"] += 1
                    if counters["write"] == n:
                        die()
                    return real_replace(src, dst)

            sio.os = _OS()
    stopper = SAGOEarlyStoppingCallback("sago/num/activation", patience=100, mode="threshold")
    cb = SAGOCallback(variant_set(), eval_steps=2, max_new_tokens=3, n_bootstrap=200,
                      axes="activation,activation_rel,confidence,generation,mirroring")
    tr = make_trainer(a.out, callbacks=[cb, stopper, *extra], max_steps=8, save_strategy="steps", save_steps=2)

    class Peek(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            live = [c for c in tr.callback_handler.callbacks if isinstance(c, SAGOEarlyStoppingCallback)][0]
            with open(os.path.join(a.out, "stopper_at_begin.json"), "w") as f:
                json.dump(live.state()["attributes"], f)

    tr.add_callback(Peek())
    resume = get_last_checkpoint(a.out) if a.resume else None
    tr.train(resume_from_checkpoint=resume)
    with open(os.path.join(a.out, "finished.json"), "w") as f:
        json.dump({"resumed_from": resume, "stopper": stopper.state()["attributes"]}, f)


if __name__ == "__main__":
    main()
