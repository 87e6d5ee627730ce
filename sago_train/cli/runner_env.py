"""The environment a recipe run sets for W&B: offline unless the user logged in, its files under the run."""

from __future__ import annotations

import os
from pathlib import Path


def wandb_mode_default() -> None:
    """W&B runs offline unless the user has logged in (an API key in the environment or ~/.netrc)."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return
    os.environ["WANDB_MODE"] = "offline"


#: WANDB_DIR as the user's environment had it when this module was first imported (None: unset).
_USER_WANDB_DIR = os.environ.get("WANDB_DIR")


def wandb_dir_default(output_dir: str) -> None:
    """W&B writes its run files under the run's output directory (``<output_dir>/wandb``), not into the current
    directory, unless the user chose ``WANDB_DIR``. Set per run: several runs in one process (the demo's arms)
    each get their own."""
    if _USER_WANDB_DIR is not None:
        return
    os.makedirs(output_dir, exist_ok=True)
    os.environ["WANDB_DIR"] = str(Path(output_dir).resolve())
