"""``sago-train``: entry point and sub-command dispatch. User errors print one line and exit with 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import SagoInputError
from ..formatting import printable
from ..version import __version__
from . import compare_cmd, eval_cmd, report_cmd, run_cmd, study_cmd, variants_cmd

COMMANDS = {
    "eval": eval_cmd,
    "run": run_cmd,
    "report": report_cmd,
    "compare": compare_cmd,
    "study": study_cmd,
    "variants": variants_cmd,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sago-train",
        description="SAGO: measure how much a model's behaviour changes across variants of the same input.",
    )
    parser.add_argument("--version", action="version", version=f"sago_train {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    try:
        return int(args.func(args) or 0)
    except SagoInputError as err:
        print(f"sago-train {args.command}: error: {printable(err)}", file=sys.stderr)  # one line, inert text
        return 2
    except KeyboardInterrupt:
        print("sago-train: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
