"""The data of the pool experiment (docs/loss-experiment.md#the-pool-experiment), built deterministically from a seed.

The task is an **output format the untrained model lacks**: every fact is answered as ``" <answer>, indeed."``
(the tiny model answers ``" Paris."``), so a fine-tune must learn it, and what it learns transfers to facts it
never trained on (the format is the same for every fact; the answer is one the model already knows). The 104
facts of the tiny model are split, seeded, into three parts with no fact in two:

- ``labeled`` (16 facts): training groups with the target;
- ``pool`` (48 facts, 3x the labeled set): the same task's prompts with **no target** (unlabeled);
- ``held-out`` (40 facts): never trained, the evaluation's instances.

Every training group (labeled or pool) is ``[canonical, alt, question, terse]`` (paraphrases: three of the family's
phrasings) and the run adds fresh ``typo`` / ``whitespace`` draws each time it collates the group. The evaluation
sets, per held-out fact and draw ``d`` (ids ``<fact>#d<d>``):

- ``instances``: ``[canonical, alt, question, terse, typo, whitespace]`` (the trained kinds, on unseen facts);
- ``kinds``: ``[canonical, alt2, inverted, casing, template]`` (kinds no arm trains on: two phrasings never
  trained, lower casing, and a prompt template, ``Q: ...`` or ``Fact: ...``);

and, to measure the training groups too, ``labeled`` and ``pool`` with the ``instances`` layout (one draw).

On SmolLM2-135M-Instruct (``model="smollm2"``) the facts are the templated families of the bundled real sets
(capitals, opposites, arithmetic: 135 facts, :func:`real_facts`), each phrasing a question sent as the user
message; the answer is ``"Paris, indeed."`` and the end of the turn. The split is the same (16 labeled, 48 in the
pool), so 71 facts are held out.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The phrasings a training group carries beside its canonical one, and those only the evaluation asks.
TRAINED_PHRASINGS = ("alt", "question", "terse")
HELD_OUT_PHRASINGS = ("alt2", "inverted")
#: Noise drawn afresh in training (``fresh_kinds``) and once per held-out group in the ``instances`` set.
FRESH_KINDS = ("typo", "whitespace")
TEMPLATES = ("Q: {prompt}", "Fact: {prompt}")
SPLIT = {"labeled": 16, "pool": 48}  # the rest (40 of 104) held out


@dataclass(frozen=True)
class Fact:
    """One fact of a family: its prompt in every phrasing, the formatted target and the reference."""

    id: str
    prompts: dict[str, str]
    answer: str
    #: Other right answers (the real sets' aliases: "small" or "little"); the target uses ``answer``.
    aliases: tuple[str, ...] = ()
    #: The prompt is the user message of a chat (SmolLM2), the target the assistant's turn and its end.
    chat: bool = False

    @property
    def target(self) -> str:
        return f"{self.answer}, indeed.<|im_end|>" if self.chat else f" {self.answer}, indeed."

    @property
    def reference(self) -> str | list[str]:
        refs = [f"{a}, indeed" for a in (self.answer, *self.aliases)]
        return refs if self.aliases else refs[0]

    def variant(self, text: str) -> str | list[dict[str, str]]:
        """``text`` (a phrasing, perturbed or not) as the model is asked it."""
        return [{"role": "user", "content": text}] if self.chat else text


def facts(model: str = "tiny") -> list[Fact]:
    """The model's facts in every phrasing: the tiny model's own (scripts/build_tiny_model.py), or SmolLM2's
    (:func:`real_facts`)."""
    if model == "smollm2":
        return real_facts()
    if model != "tiny":
        raise ValueError(f"model {model!r}: expected 'tiny' or 'smollm2'")
    from build_tiny_model import FAMILIES, slug

    return [Fact(f"{fam.name}-{slug(s)}", {k: fam.prompt(k, s) for k in fam.templates}, a)
            for fam in FAMILIES for s, a in fam.facts]


_OPS = {"+": ("plus", "If you add {a} and {b}, what do you get?"),
        "-": ("minus", "If you take {b} away from {a}, what is left?"),
        "*": ("times", "If you multiply {a} by {b}, what do you get?")}
#: SmolLM2's phrasings per real family (``{s}``: the subject; arithmetic: ``{a} {op} {b}``, ``{w}`` the operator
#: in words). ``canonical`` and ``alt`` are the real sets' own canonical and paraphrase questions; the other four
#: were written for this experiment, before it ran.
REAL_TEMPLATES = {
    "capitals": {"canonical": "What is the capital of {s}?", "alt": "Which city is the capital city of {s}?",
                 "question": "Can you tell me the capital of {s}?", "terse": "Capital of {s}?",
                 "alt2": "Name the capital city of {s}.", "inverted": "{s}'s capital is which city?"},
    "opposites": {"canonical": "What is the opposite of '{s}'?", "alt": "Which word means the reverse of '{s}'?",
                  "question": "Can you tell me the opposite of '{s}'?", "terse": "Opposite of '{s}'?",
                  "alt2": "Name the antonym of '{s}'.", "inverted": "'{s}' is the opposite of which word?"},
    "arithmetic": {"canonical": "What is {a} {op} {b}?", "alt": "{alt}",
                   "question": "Can you tell me what {a} {op} {b} is?", "terse": "{a} {op} {b} = ?",
                   "alt2": "Name the result of {a} {w} {b}.", "inverted": "{a} {w} {b} equals what?"},
}
_REAL_QUESTION = {"capitals": re.compile(r"What is the capital of (?P<s>[^?]+)\?"),
                  "opposites": re.compile(r"What is the opposite of '(?P<s>[^']+)'\?"),
                  "arithmetic": re.compile(r"What is (?P<a>\d+) (?P<op>[-+*]) (?P<b>\d+)\?")}


def real_facts() -> list[Fact]:
    """SmolLM2's facts: every group of the bundled real sets capitals, opposites and arithmetic
    (sago_train/assets/sets/real; science has no common template), parsed from its canonical question and asked
    in the six phrasings of :data:`REAL_TEMPLATES`. A question that does not parse is an error, not a skip."""
    from experiment_loss_sets import plain_question

    from sago_train.data import VariantSet

    out = []
    for family, templates in REAL_TEMPLATES.items():
        path = ROOT / "sago_train" / "assets" / "sets" / "real" / f"{family}.jsonl"
        for g in VariantSet.from_jsonl(path, name=family):
            question = plain_question(g.variants[g.canonical])
            m = _REAL_QUESTION[family].fullmatch(question)
            if m is None:
                raise ValueError(f"{path}: group {g.id!r}: canonical question {question!r} does not match "
                                 f"{_REAL_QUESTION[family].pattern!r}")
            fields = m.groupdict()
            if family == "arithmetic":
                word, alt = _OPS[fields["op"]]
                fields.update(w=word, alt=alt.format(**fields))
            refs = [g.reference] if isinstance(g.reference, str) else list(g.reference)
            refs = [r.strip() for r in refs]
            out.append(Fact(g.id, {k: t.format(**fields) for k, t in templates.items()}, refs[0],
                            tuple(refs[1:]), chat=True))
    return out


def split(all_facts: list[Fact], seed: int) -> dict[str, list[Fact]]:
    """``{"labeled", "pool", "held_out"}``: a seeded partition, independent of the input order."""
    order = sorted(all_facts, key=lambda f: hashlib.sha256(f"pool:{seed}:{f.id}".encode()).hexdigest())
    n_lab, n_pool = SPLIT["labeled"], SPLIT["pool"]
    if len(order) < n_lab + n_pool + 2:
        raise ValueError(f"{len(order)} facts cannot make {n_lab} labeled + {n_pool} pool + held-out ones")
    parts = {"labeled": order[:n_lab], "pool": order[n_lab:n_lab + n_pool], "held_out": order[n_lab + n_pool:]}
    return {k: sorted(v, key=lambda f: f.id) for k, v in parts.items()}


def _drawn(prompt: str, gid: str, kinds: list[str], seed: int) -> list[str]:
    """One seeded draw per kind, by the drawer training uses (:class:`sago_train.training.fresh.FreshVariants`)."""
    from sago_train.data.groups import VariantGroup
    from sago_train.training.fresh import FreshVariants

    group = FreshVariants(len(kinds), kinds, seed, keep_fixed=False)(VariantGroup(id=gid, variants=[prompt, prompt]))
    return list(group.variants[1:])


def _templated(prompt: str, gid: str, seed: int) -> str:
    from sago_train.data.examples import Example
    from sago_train.data.generators.template import TemplateGenerator

    rng = random.Random(hashlib.sha256(f"template:{seed}:{gid}".encode()).hexdigest())
    return TemplateGenerator(list(TEMPLATES)).generate(Example.from_dict({"id": gid, "prompt": prompt}), rng).text


def _lower(prompt: str) -> str:
    from sago_train.data.generators.noise import CasingGenerator

    return CasingGenerator("lower").perturb(prompt, random.Random(0))


def training_group(f: Fact, *, labeled: bool) -> dict[str, Any]:
    row = {"id": f.id, "variants": [f.variant(f.prompts[k]) for k in ("canonical", *TRAINED_PHRASINGS)],
           "kinds": ["canonical", *TRAINED_PHRASINGS]}
    return {**row, "target": f.target} if labeled else row


def instances_group(f: Fact, gid: str, seed: int) -> dict[str, Any]:
    canonical = f.prompts["canonical"]
    texts = [canonical, *(f.prompts[k] for k in TRAINED_PHRASINGS), *_drawn(canonical, gid, list(FRESH_KINDS), seed)]
    return {"id": gid, "variants": [f.variant(t) for t in texts],
            "kinds": ["canonical", *TRAINED_PHRASINGS, *FRESH_KINDS], "reference": f.reference,
            "meta": {"fact": f.id}}


def kinds_group(f: Fact, gid: str, seed: int) -> dict[str, Any]:
    canonical = f.prompts["canonical"]
    texts = [canonical, *(f.prompts[k] for k in HELD_OUT_PHRASINGS), _lower(canonical), _templated(canonical, gid, seed)]
    return {"id": gid, "variants": [f.variant(t) for t in texts],
            "kinds": ["canonical", *HELD_OUT_PHRASINGS, "casing", "template"], "reference": f.reference,
            "meta": {"fact": f.id}}


def build(seed: int, draws: int, model: str = "tiny") -> dict[str, list[dict[str, Any]]]:
    """Every file of the experiment as lists of JSON records: ``train-labeled``, ``train-pool`` (training),
    ``instances``, ``kinds`` (held-out facts), ``labeled`` and ``pool`` (the training facts, measured)."""
    parts = split(facts(model), seed)
    held = [(f, f"{f.id}#d{d}") for f in parts["held_out"] for d in range(draws)]
    return {
        "train-labeled": [training_group(f, labeled=True) for f in parts["labeled"]],
        "train-pool": [training_group(f, labeled=False) for f in parts["pool"]],
        "instances": [instances_group(f, gid, seed) for f, gid in held],
        "kinds": [kinds_group(f, gid, seed) for f, gid in held],
        "labeled": [instances_group(f, f"{f.id}#d0", seed) for f in parts["labeled"]],
        "pool": [instances_group(f, f"{f.id}#d0", seed) for f in parts["pool"]],
    }


def write(out: Path, seed: int, draws: int, model: str = "tiny") -> dict[str, Path]:
    """Write :func:`build`'s files as ``out/<name>.jsonl`` (the same bytes for the same seed)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in build(seed, draws, model).items():
        paths[name] = out / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return paths
