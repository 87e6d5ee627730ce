"""Worker for the 2-process test: a Trainer run with SAGOCallback under torchrun (gloo, CPU).

Usage: torchrun --nproc_per_node 2 -m tests.ddp_callback_worker OUT_DIR
Learning rate 0 keeps the weights fixed, so every evaluation must equal the single-process one.
"""

from __future__ import annotations

import json
import os
import sys

from sago_train import SAGOCallback
from sago_train.results.monitor import MonitorState

from ._helpers.trainer import make_trainer, variant_set


def main() -> None:
    out = sys.argv[1]
    rank = int(os.environ.get("RANK", "0"))
    writes: list[str] = []
    for name in ("record",):  # every write of an evaluation (group records + history line)
        real = getattr(MonitorState, name)

        def spy(self, *a, _real=real, _name=name, **k):
            writes.append(_name)
            return _real(self, *a, **k)

        setattr(MonitorState, name, spy)
    cb = SAGOCallback(variant_set(n=7), eval_steps=2, max_new_tokens=3, n_bootstrap=200, batch_size=3,
                      axes="activation,activation_rel,confidence,generation,mirroring")
    extra = {"ddp_backend": "gloo"} if int(os.environ.get("WORLD_SIZE", "1")) > 1 else {}
    tr = make_trainer(out, callbacks=[cb], max_steps=4, learning_rate=0.0, per_device_train_batch_size=4, **extra)
    tr.train()
    groups = {n: [g.id for g in s.groups] for n, s in cb.last_result.sets.items()}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"writes": writes, "world": int(os.environ.get("WORLD_SIZE", "1")), "groups": groups,
                   "sago_logs": sum("eval_sago/num/activation" in h for h in tr.state.log_history)}, f)
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # both ranks have written their result; no collective is left
        # gloo's shutdown (destroy_process_group or its threads at interpreter exit) can hang or abort one rank
        # now and then on a loaded machine; the work is done and on disk, so leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
