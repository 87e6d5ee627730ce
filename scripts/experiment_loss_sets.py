"""The data of the loss experiment (docs/loss-experiment.md), built deterministically from a seed.

Facts (a canonical prompt and its answer) are split in half, seeded: the *training* facts become training groups
``{id, variants, target}``, the *held-out* facts (never trained) become the evaluation sets. The perturbation
kinds are drawn as the loss's ``fresh_kinds`` draws them (:class:`sago_train.training.fresh.FreshVariants`). Leave-one-kind-out: rotation ``r`` holds out kind ``h`` and
trains on the others; per rotation it writes

- ``train-<h>.jsonl``: per training fact ``[canonical, one fixed draw per trained kind]`` (the fixed phrasings);
- ``kinds-<h>.jsonl`` (held-out kinds): per held-out fact and draw ``d``, ``[canonical, h, h]`` (two draws of the
  kind the rotation never trains);
- ``instances-<h>.jsonl`` (held-out instances): per held-out fact and draw ``d``, ``[canonical, one draw per
  trained kind]``.

Each held-out fact gives ``draws`` groups, ids ``<fact>#d<d>``, the same ids in every rotation (so a group's
per-kind accuracies can be combined across rotations), each from its own seeded perturbation draw.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass(frozen=True)
class Fact:
    """One fact: ``prompt`` (canonical phrasing), ``target`` (the training completion), ``reference`` (what a
    correct greedy answer starts with)."""

    id: str
    prompt: Any
    target: str
    reference: str


def tiny_facts() -> list[Fact]:
    """Every fact the tiny model was trained on (scripts/build_tiny_model.py), in its canonical phrasing."""
    from build_tiny_model import FAMILIES, slug

    return [Fact(f"{fam.name}-{slug(s)}", fam.prompt("canonical", s), f" {a}.", f" {a}")
            for fam in FAMILIES for s, a in fam.facts]


def plain_question(prompt: str) -> str:
    r"""The question a few-shot prompt asks last (its final ``Question: ...`` line), or the prompt itself.

    The bundled real sets' canonical prompts are few-shot scaffolds for base models; sent whole as one chat
    message, SmolLM2-135M-Instruct often answers about the shots (0.333 of canonical prompts right in the pilot);
    asked the plain question it answered 32 of 48 (measured on 12 groups of each set, docs/loss-experiment.md).

    Example:
        >>> plain_question("Question: What is 3 + 4?\nAnswer: 7\n\nQuestion: What is 7 + 2?\nAnswer:")
        'What is 7 + 2?'
    """
    questions = [line[len("Question: "):] for line in prompt.split("\n") if line.startswith("Question: ")]
    return questions[-1].strip() if questions else prompt


def real_facts(max_per_set: int | None = None) -> list[Fact]:
    """The canonical question of every group of the bundled real sets (sago_train/assets/sets/real), for
    SmolLM2-135M-Instruct: the plain question (:func:`plain_question`) as a user message (rendered by the chat
    template in training and evaluation alike) answered by the set's reference and the end-of-turn token."""
    from sago_train.data import VariantSet

    facts = []
    for name in ("arithmetic", "capitals", "opposites", "science"):
        vs = VariantSet.from_jsonl(ROOT / "sago_train" / "assets" / "sets" / "real" / f"{name}.jsonl", name=name)
        for g in list(vs)[:max_per_set]:
            ref = g.reference if isinstance(g.reference, str) else g.reference[0]
            question = plain_question(g.variants[g.canonical])
            facts.append(Fact(g.id, [{"role": "user", "content": question}], f"{ref.strip()}<|im_end|>", ref.strip()))
    return facts


def split(facts: Sequence[Fact], seed: int) -> tuple[list[Fact], list[Fact]]:
    """Half the facts for training, the rest held out; seeded, independent of the input order."""
    order = sorted(facts, key=lambda f: hashlib.sha256(f"{seed}:{f.id}".encode()).hexdigest())
    half = len(order) // 2
    return sorted(order[:half], key=lambda f: f.id), sorted(order[half:], key=lambda f: f.id)


def _drawn(prompt: Any, gid: str, kinds: Sequence[str], n: int, seed: int) -> list[Any]:
    """``n`` seeded draws of ``kinds`` (in turn) of ``prompt``, by the drawer the loss's ``fresh_variants`` uses
    (:class:`sago_train.training.fresh.FreshVariants`), so held-out and fixed variants come from the same
    perturbation distributions as the fresh training draws (e.g. ``casing`` picks its style per draw)."""
    from sago_train.data.groups import VariantGroup
    from sago_train.training.fresh import FreshVariants

    # A group needs 2 variants; keep_fixed=False keeps only the canonical of these two.
    group = FreshVariants(n, list(kinds), seed, keep_fixed=False)(VariantGroup(id=gid, variants=[prompt, prompt]))
    return list(group.variants[1:])


def rotation_sets(facts: Sequence[Fact], kinds: Sequence[str], held_out: str, *, seed: int, draws: int,
                  max_train: int | None = None, max_groups: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """The three files of one rotation (see the module docstring), as lists of JSON records."""
    if held_out not in kinds:
        raise ValueError(f"held-out kind {held_out!r} is not among the kinds {list(kinds)}")
    trained = [k for k in kinds if k != held_out]
    train_facts, test_facts = split(facts, seed)
    train = [{"id": f.id, "variants": [f.prompt, *_drawn(f.prompt, f.id, trained, len(trained), seed)],
              "kinds": ["canonical", *trained], "target": f.target} for f in train_facts[:max_train]]
    kinds_set, instances = [], []
    for f in test_facts:
        for d in range(draws):
            gid, meta = f"{f.id}#d{d}", {"fact": f.id, "draw": d}
            kinds_set.append({"id": gid, "variants": [f.prompt, *_drawn(f.prompt, gid, [held_out], 2, seed)],
                              "kinds": ["canonical", held_out, f"{held_out}-2"], "reference": f.reference,
                              "meta": meta})
            instances.append({"id": gid, "variants": [f.prompt, *_drawn(f.prompt, gid, trained, len(trained), seed)],
                              "kinds": ["canonical", *trained], "reference": f.reference, "meta": meta})
    return {"train": train, "kinds": kinds_set[:max_groups], "instances": instances[:max_groups]}


def write_rotation(out: Path, records: dict[str, list[dict[str, Any]]], held_out: str) -> dict[str, Path]:
    """Write one rotation's files under ``out``; returns ``{"train"|"kinds"|"instances": path}``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for part, rows in records.items():
        path = out / f"{part}-{held_out}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        paths[part] = path
    return paths
