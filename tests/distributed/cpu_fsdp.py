"""Let accelerate's FSDP plugin shard on CPU, for the 2-process tests (never needed on GPUs).

accelerate (1.15) enables its FSDP plugin only on accelerator devices: ``AcceleratorState`` takes the FSDP path
for MULTI_GPU, MULTI_NPU, MULTI_XPU, ... but not for MULTI_CPU, so ``accelerate launch --config_file
recipes/accelerate/fsdp.yaml`` on a CPU-only machine trains with plain DDP and ignores the FSDP settings, with no
message. torch itself shards on CPU (``fully_shard`` over a gloo process group), so this one decision is
patched: when accelerate built an FSDP plugin from the launcher's environment and settled on MULTI_CPU, the
state becomes FSDP with that plugin. Everything after it (wrapping the blocks, the Trainer's FSDP code paths,
the optimizer over sharded parameters) is accelerate's and transformers' own code.
"""

from __future__ import annotations

import os
from typing import Any


def allow_fsdp_on_cpu() -> None:
    """Patch ``AcceleratorState.__init__`` as the module doc says; does nothing unless ``ACCELERATE_USE_FSDP``
    is set (``accelerate launch`` with an FSDP config)."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "_sago_cpu_fsdp", False):
        return

    def init(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            # What accelerate's own FSDP branch does (accelerate/state.py, AcceleratorState.__init__).
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin

    init._sago_cpu_fsdp = True  # type: ignore[attr-defined]
    AcceleratorState.__init__ = init
