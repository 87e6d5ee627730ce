"""``sago-train variants``: build a JSONL variant set from plain examples with the seeded generators."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from ..errors import SagoInputError
from ..io import atomic_write_jsonl, check_output_path, validate_set_name
from ..limits import check_seed

# Generators run in this fixed order whatever the order of the flags, so the kinds (and so the file) depend
# only on which options are given and the seed.
GENERATOR_FLAGS = "--templates, --format, --instructions, --shuffle-options, --typo-rate, --casing, --whitespace"
#: The most draws per generator (--n): a group's variants are evaluated together.
MAX_DRAWS = 64


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "variants",
        help="build a variant set (JSONL) from plain examples",
        description="Build a variant set from plain examples: each example becomes one group whose variant 0 is "
        "the original (kind 'canonical', a name reserved for it) followed by --n variants per selected generator "
        f"(kinds typo, typo-2, ...), in the order {GENERATOR_FLAGS}. Seeded and deterministic: each draw has its "
        "own seed (from --seed, the example and the kind). An example is a JSON object with 'prompt' (free text) or "
        "'question'/'fields', optional 'choices' + 'answer', 'instruction', 'reference', 'id', 'meta'.",
    )
    p.add_argument("--input", required=True, metavar="EXAMPLES.jsonl", help="plain examples (JSONL or a JSON list)")
    p.add_argument("--out", required=True, metavar="SET.jsonl", help="where to write the variant set")
    p.add_argument("--name", default=None,
                   help="set name (default: the output file's stem, which is also the name it loads under)")
    p.add_argument("--templates", default=None, metavar="FILE",
                   help="prompt templates ({prompt}, {body}, {choices}, {question}, ...): a JSON/YAML list, or a "
                   "text file with one per line or blocks separated by '---' lines")
    p.add_argument("--format", action="store_true",
                   help="FormatSpread-style perturbations: separators, field-name casing and aliases, option labels "
                   "(needs structured examples or an instruction)")
    p.add_argument("--instructions", default=None, metavar="FILE", help="alternative instructions (same file forms)")
    p.add_argument("--shuffle-options", action="store_true",
                   help="permute multiple-choice options (the answer index is remapped per variant)")
    p.add_argument("--typo-rate", type=float, default=None, metavar="R",
                   help="character noise: each letter edited with probability R in (0, 1]")
    p.add_argument("--casing", default=None, metavar="MODE", help="lower|upper|title|swap|random casing of the content")
    p.add_argument("--whitespace", action="store_true", help="extra spaces/newlines between words")
    p.add_argument("--n", type=int, default=1, metavar="K",
                   help="variants per generator and example, each a seeded draw of its own (default 1): e.g. "
                   "--templates FILE --n 3 makes 3 paraphrases per group")
    p.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    p.set_defaults(func=run)
    return p


def build_generators(args: argparse.Namespace) -> list[Any]:
    """The generators selected by the flags, in the fixed order of :data:`GENERATOR_FLAGS`."""
    from ..data.generators import InstructionGenerator, TemplateGenerator, make_generator

    selected: list[tuple[str, Any]] = []
    if args.templates is not None:
        selected.append(("--templates", lambda: TemplateGenerator.from_file(args.templates)))
    if args.format:
        selected.append(("--format", lambda: make_generator("format")))
    if args.instructions is not None:
        selected.append(("--instructions", lambda: InstructionGenerator.from_file(args.instructions)))
    if args.shuffle_options:
        selected.append(("--shuffle-options", lambda: make_generator("option_shuffle")))
    if args.typo_rate is not None:
        selected.append(("--typo-rate", lambda: make_generator("typo", rate=args.typo_rate)))
    if args.casing is not None:
        selected.append(("--casing", lambda: make_generator("casing", mode=args.casing)))
    if args.whitespace:
        selected.append(("--whitespace", lambda: make_generator("whitespace")))
    gens: list[Any] = []
    for flag, build in selected:
        try:
            gens.append(build())
        except SagoInputError as err:
            # Name the flag the user typed rather than the generator's Python parameter ("mode", "rate").
            raise SagoInputError(f"{flag}: {err.message}", source=err.source, line=err.line, hint=err.hint) from None
    if not gens:
        raise SagoInputError(f"no generator selected: give at least one of {GENERATOR_FLAGS}")
    n = getattr(args, "n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_DRAWS:
        raise SagoInputError(f"--n: expected an integer in [1, {MAX_DRAWS}], got {n!r}", key="--n")
    return [g for g in gens for _ in range(n)]  # kinds typo, typo-2, ...: each draw seeded by its own kind


def run(args: argparse.Namespace) -> int:
    from ..data.build import build_variant_set, unchanged_counts
    from ..data.examples import load_examples
    from .console import make_console
    from .console import user_text as esc

    out = Path(args.out)
    inputs = {f"the {flag} file": path for flag, path in (("--input", args.input), ("--templates", args.templates),
                                                           ("--instructions", args.instructions)) if path}
    check_output_path(out, what="--out", inputs=inputs)  # before any generator runs or any example is read
    stem = re.sub(r"[^A-Za-z0-9_.\-]", "_", out.stem)  # the name VariantSet.from_jsonl will give the file
    name = validate_set_name(args.name if args.name is not None else stem, key="name")
    check_seed(args.seed, key="--seed")
    generators = build_generators(args)  # option errors first, before reading a possibly large file
    examples = load_examples(args.input)
    vs = build_variant_set(examples, generators, name=name, seed=args.seed)
    atomic_write_jsonl(out, [g.to_dict() for g in vs])

    console = make_console()
    n_variants = sum(g.k for g in vs)
    kinds = vs.kinds or []
    console.print(f"wrote {len(vs)} groups, {n_variants} variants ({len(kinds)} per group: {esc(', '.join(kinds))}) "
                  f"to {esc(str(out))} (set '{esc(name)}', seed {args.seed})")
    unchanged = unchanged_counts(vs)
    console.print("unchanged variants (identical to the original after every retry; kept, not dropped): "
                  + esc(", ".join(f"{k} {v}/{len(vs)}" for k, v in unchanged.items())))
    for kind, count in unchanged.items():
        if count == len(vs):
            console.print(f"warning: '{esc(kind)}' changed no example (e.g. lower casing of lowercase text): its "
                          "variants equal the originals")
    if name != stem:
        console.print(f"note: the file loads as set '{esc(stem)}' by default; use --set {esc(name)}={esc(str(out))}")
    return 0
