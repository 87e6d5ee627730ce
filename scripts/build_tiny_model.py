#!/usr/bin/env python
"""Build the tiny byte-level Llama shipped with sago_train, its example variant sets and the demo data.

Everything here is synthetic, seeded and CPU-only, so a clean checkout rebuilds the same files:

* ``sago_train/assets/tiny-llama/``: a ~3.5 MB Llama (4 decoder layers) with a byte-level tokenizer, trained
  from scratch on short facts (capitals, languages, animal sounds, colours, tools). Each fact is written in
  several phrasings; only the *trained* phrasings ("canonical", "alt", "alt2") are in the corpus, the
  others are held out, so the model is right on trained phrasings and less reliable on rewordings, format changes and
  typos: exactly the kind of instability SAGO measures.
* ``sago_train/assets/sets/{paraphrase,format,typo}.jsonl``: the default variant sets of ``sago-train eval``,
  about facts the model was trained on; variant 0 (canonical) is a trained phrasing.
* ``sago_train/assets/demo/``: data for the LoRA demo, about a fact family (opposites) that is NOT in the
  pretraining corpus; see :func:`write_demo` for the split.

Usage::

    .venv/bin/python scripts/build_tiny_model.py                 # full build (a few minutes on 2 CPU cores)
    .venv/bin/python scripts/build_tiny_model.py --sets-only     # rewrite sets and demo data, no training
    .venv/bin/python scripts/build_tiny_model.py --steps 3 --out /tmp/tiny --no-sets --no-eval   # smoke build

At the end the build prints greedy accuracy per phrasing kind, measured on the model it just trained.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # allow running from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

ASSETS = ROOT / "sago_train" / "assets"
DEFAULT_OUT = ASSETS / "tiny-llama"
DEFAULT_SETS = ASSETS / "sets"
DEFAULT_DEMO = ASSETS / "demo"

SEED = 1234
PAD, BOS, EOS = "<pad>", "<s>", "</s>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
N_SPECIAL = 3  # byte b has id N_SPECIAL + b
VOCAB_SIZE = N_SPECIAL + 256

# Chat template: plain "User: ...\nAssistant:" turns. It deliberately does not emit the BOS token: SAGO
# tokenizes rendered prompts with the tokenizer's default encoding, whose post-processor already adds <s>,
# so a BOS in the template would be doubled.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] }}</s>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

# Model shape: small enough to train in minutes on a laptop CPU and ship in the wheel (~3.5 MB in fp32),
# deep enough (4 blocks) that SAGO's default layer selection picks distinct layers.
MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
}


# ---------------------------------------------------------------------------------------------------------
# Facts and phrasings
# ---------------------------------------------------------------------------------------------------------

# Phrasings in the pretraining corpus. "alt2" is a question phrasing close to the held-out "question" one, so
# that some rewordings transfer (the paraphrase set then shows graded, not all-or-nothing, failures).
TRAINED_KINDS = ("canonical", "alt", "alt2")
HELDOUT_KINDS = ("question", "inverted", "terse")  # held-out rewordings (the paraphrase set)


@dataclass(frozen=True)
class Family:
    """A fact family: ``(subject, answer)`` pairs and one template per phrasing kind.

    Templates use ``{s}`` for the subject and ``{S}`` for the subject with its first letter capitalized
    (for sentence-initial subjects). Every prompt is followed by ``" " + answer + "."``.
    """

    name: str
    templates: dict[str, str]
    facts: tuple[tuple[str, str], ...]

    def prompt(self, kind: str, subject: str) -> str:
        return self.templates[kind].format(s=subject, S=subject[:1].upper() + subject[1:])


FAMILIES: tuple[Family, ...] = (
    Family(
        "capital",
        {
            "canonical": "The capital of {s} is",
            "alt": "{S} has its capital in",
            "alt2": "Which city is the capital of {s}?",
            "question": "What is the capital of {s}?",
            "inverted": "{S}'s capital is",
            "terse": "capital of {s}:",
        },
        (
            ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("China", "Beijing"), ("Egypt", "Cairo"),
            ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Canada", "Ottawa"),
            ("Russia", "Moscow"), ("Greece", "Athens"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
            ("Finland", "Helsinki"), ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Ireland", "Dublin"),
            ("Cuba", "Havana"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"), ("Turkey", "Ankara"),
            ("Iran", "Tehran"), ("Hungary", "Budapest"), ("Denmark", "Copenhagen"), ("Belgium", "Brussels"),
            ("Ghana", "Accra"), ("Argentina", "Buenos Aires"),
        ),
    ),
    # Same subjects as "capital" for many facts, so the model must condition on the relation, not only on
    # the country; a held-out phrasing can then produce the wrong relation's answer.
    Family(
        "language",
        {
            "canonical": "The language spoken in {s} is",
            "alt": "In {s}, people speak",
            "alt2": "Which language do people speak in {s}?",
            "question": "What language is spoken in {s}?",
            "inverted": "{S}'s language is",
            "terse": "language of {s}:",
        },
        (
            ("France", "French"), ("Germany", "German"), ("Italy", "Italian"), ("Spain", "Spanish"),
            ("Portugal", "Portuguese"), ("Japan", "Japanese"), ("China", "Chinese"), ("Russia", "Russian"),
            ("Greece", "Greek"), ("Norway", "Norwegian"), ("Sweden", "Swedish"), ("Finland", "Finnish"),
            ("Poland", "Polish"), ("Brazil", "Portuguese"), ("Mexico", "Spanish"), ("Egypt", "Arabic"),
            ("Iran", "Persian"), ("Turkey", "Turkish"), ("Thailand", "Thai"), ("Vietnam", "Vietnamese"),
            ("Hungary", "Hungarian"), ("Denmark", "Danish"), ("Korea", "Korean"), ("Cuba", "Spanish"),
        ),
    ),
    Family(
        "animal",
        {
            "canonical": "The sound a {s} makes is",
            "alt": "A {s} says",
            "alt2": "Which sound does a {s} make?",
            "question": "What sound does a {s} make?",
            "inverted": "A {s} makes the sound",
            "terse": "{s} sound:",
        },
        (
            ("dog", "woof"), ("cat", "meow"), ("cow", "moo"), ("duck", "quack"), ("sheep", "baa"),
            ("pig", "oink"), ("horse", "neigh"), ("lion", "roar"), ("snake", "hiss"), ("frog", "croak"),
            ("bee", "buzz"), ("crow", "caw"), ("mouse", "squeak"), ("wolf", "howl"), ("goat", "bleat"),
            ("donkey", "bray"),
        ),
    ),
    Family(
        "colour",
        {
            "canonical": "The colour of {s} is",
            "alt": "{S} has the colour",
            "alt2": "Which colour is {s}?",
            "question": "What colour is {s}?",
            "inverted": "{S} is coloured",
            "terse": "colour of {s}:",
        },
        (
            ("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"), ("blood", "red"),
            ("a banana", "yellow"), ("a lemon", "yellow"), ("a carrot", "orange"), ("a tomato", "red"),
            ("milk", "white"), ("chocolate", "brown"), ("an eggplant", "purple"), ("a flamingo", "pink"),
            ("an emerald", "green"), ("ink", "black"), ("the sea", "blue"), ("a pumpkin", "orange"),
            ("a ruby", "red"),
        ),
    ),
    Family(
        "tool",
        {
            "canonical": "{S} is used for",
            "alt": "People use {s} for",
            "alt2": "Why would you use {s}?",
            "question": "What is {s} used for?",
            "inverted": "The purpose of {s} is",
            "terse": "use of {s}:",
        },
        (
            ("a hammer", "nailing"), ("a saw", "cutting"), ("a pen", "writing"), ("a broom", "sweeping"),
            ("a shovel", "digging"), ("a needle", "sewing"), ("a brush", "painting"), ("a ladder", "climbing"),
            ("an oven", "baking"), ("a razor", "shaving"), ("a net", "fishing"), ("a kettle", "boiling"),
            ("a lamp", "lighting"), ("a fork", "eating"), ("a bucket", "carrying"), ("a map", "navigating"),
        ),
    ),
)

# Reserved for the fine-tuning demo: NOT in the pretraining corpus (the phrase "opposite" never occurs there).
DEMO_FAMILY = Family(
    "opposite",
    {
        "canonical": "The opposite of {s} is",
        "question": "What is the opposite of {s}?",
        "inverted": "{S} is the opposite of",
        "terse": "opposite of {s}:",
        # Used only by demo/groups.jsonl (the stability-loss training groups), never by the monitoring sets.
        "antonym": "The antonym of {s} is",
        "which": "Which word means the opposite of {s}?",
        "flip": "{S}, and its opposite:",
    },
    (
        ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("light", "dark"), ("wet", "dry"),
        ("happy", "sad"), ("early", "late"), ("rich", "poor"), ("old", "young"), ("hard", "soft"),
        ("loud", "quiet"), ("full", "empty"), ("thick", "thin"), ("strong", "weak"), ("open", "closed"),
        ("high", "low"), ("long", "short"), ("clean", "dirty"), ("sweet", "sour"), ("true", "false"),
        ("inside", "outside"), ("push", "pull"), ("win", "lose"), ("love", "hate"), ("buy", "sell"),
        ("first", "last"), ("day", "night"), ("north", "south"), ("east", "west"), ("left", "right"),
        ("top", "bottom"), ("always", "never"), ("friend", "enemy"), ("begin", "end"), ("alive", "dead"),
        ("cheap", "expensive"), ("sharp", "dull"), ("wide", "narrow"), ("deep", "shallow"),
    ),
)


def slug(text: str) -> str:
    """A lowercase id fragment: letters and digits, words joined by '-'."""
    return "-".join("".join(c for c in w if c.isalnum()) for w in text.lower().split())


def sample_text(prompt: str, answer: str) -> str:
    """Prompt plus answer, as the model sees it in training (BOS/EOS are added as ids, not text)."""
    return f"{prompt} {answer}."


def training_texts() -> list[str]:
    """The pretraining corpus: every fact in every *trained* phrasing (:data:`TRAINED_KINDS`)."""
    return [
        sample_text(fam.prompt(kind, subj), ans)
        for fam in FAMILIES
        for subj, ans in fam.facts
        for kind in TRAINED_KINDS
    ]


# ---------------------------------------------------------------------------------------------------------
# Perturbations (seeded; every call takes its own random.Random so results do not depend on call order)
# ---------------------------------------------------------------------------------------------------------

# Field names and separators in the spirit of FormatSpread: the same request in a different prompt format.
QA_FORMATS = (
    "Q: {p}\nA:",
    "Question: {p}\nAnswer:",
    "Input: {p}\nOutput:",
    "QUERY: {p} ANSWER:",
    "{p}\n\nAnswer:",
    "Prompt: {p} || Response:",
)
SPACINGS = ("double", "newline", "tab")
_KEY_NEIGHBOURS = {
    "a": "qsz", "b": "vgn", "c": "xdv", "d": "sfe", "e": "wrd", "f": "dgr", "g": "fht", "h": "gjy",
    "i": "uok", "j": "hku", "k": "jli", "l": "ko", "m": "nj", "n": "bmh", "o": "ipl", "p": "ol",
    "q": "wa", "r": "etf", "s": "adw", "t": "ryg", "u": "yij", "v": "cfb", "w": "qes", "x": "zsc",
    "y": "tuh", "z": "xa",
}


def qa_format(prompt: str, rng: random.Random) -> str:
    """Wrap the prompt in a randomly chosen field-name/separator format."""
    return rng.choice(QA_FORMATS).format(p=prompt)


def spacing(prompt: str, rng: random.Random) -> str:
    """Change the whitespace between words (never at the end, so the reference still follows directly)."""
    words = prompt.split(" ")
    style = rng.choice(SPACINGS)
    if style == "double":
        return "  ".join(words)
    if style == "newline":
        cut = rng.randrange(1, len(words)) if len(words) > 1 else 1
        return " ".join(words[:cut]) + "\n" + " ".join(words[cut:])
    return "\t".join(words)


def typo(text: str, n: int, rng: random.Random) -> str:
    """Apply ``n`` character edits (swap, drop, double, keyboard neighbour) at distinct letter positions."""
    chars = list(text)
    letters = [i for i, c in enumerate(chars) if c.isalpha()]
    # Edit from right to left so earlier positions stay valid after drops/doubles.
    for i in sorted(rng.sample(letters, min(n, len(letters))), reverse=True):
        op = rng.choice(("swap", "drop", "double", "neighbour"))
        c = chars[i]
        if op == "swap" and i + 1 < len(chars) and chars[i + 1].isalpha() and chars[i + 1] != c:
            chars[i], chars[i + 1] = chars[i + 1], c
        elif op == "drop" and len(letters) > 3:
            del chars[i]
        elif op == "double":
            chars.insert(i, c)
        else:
            sub = rng.choice(_KEY_NEIGHBOURS.get(c.lower(), "e"))
            chars[i] = sub.upper() if c.isupper() else sub
    out = "".join(chars)
    return out if out != text else text[: letters[0]] + text[letters[0]] + text[letters[0]:]


def _rng(*parts: object) -> random.Random:
    # A str seed is hashed with SHA-512 by random.seed (version 2): stable across runs and PYTHONHASHSEED.
    return random.Random(":".join(str(p) for p in (SEED, *parts)))


# Each set perturbs the canonical (trained) phrasing along one axis; variant 0 is always the canonical one.
SET_KINDS: dict[str, tuple[str, ...]] = {
    "paraphrase": ("canonical", "question", "inverted", "terse"),
    "format": ("canonical", "qa_format", "upper", "spacing"),
    "typo": ("canonical", "typo1", "typo2", "lower"),
}
PERTURBATIONS: dict[str, Callable[[str, random.Random], str]] = {
    "qa_format": qa_format,
    "upper": lambda p, rng: p.upper(),
    "spacing": spacing,
    "typo1": lambda p, rng: typo(p, 1, rng),
    "typo2": lambda p, rng: typo(p, 2, rng),
    "lower": lambda p, rng: p.lower(),
}
# Facts per family in the bundled sets (28 groups); the same facts in all three sets, so sets differ only
# in the axis of variation.
SET_FACTS_PER_FAMILY = {"capital": 10, "language": 5, "animal": 5, "colour": 4, "tool": 4}


def variant(fam: Family, kind: str, subject: str, rng_parts: Sequence[object]) -> str:
    """The prompt for ``subject`` in phrasing ``kind``: a template, or a perturbation of the canonical one."""
    if kind in fam.templates:
        return fam.prompt(kind, subject)
    return PERTURBATIONS[kind](fam.prompt("canonical", subject), _rng(*rng_parts, kind))


def make_group(fam: Family, subject: str, answer: str, set_name: str, meta: dict[str, Any] | None = None) -> dict:
    """One SPEC variant group for a fact in set ``set_name`` (kinds from :data:`SET_KINDS`)."""
    gid = f"{fam.name}-{slug(subject)}"
    kinds = list(SET_KINDS[set_name])
    variants = [variant(fam, kind, subject, (set_name, gid)) for kind in kinds]
    rec: dict[str, Any] = {"id": gid, "variants": variants, "kinds": kinds, "reference": f" {answer}"}
    rec["meta"] = {"family": fam.name, **(meta or {})}
    return rec


def set_facts() -> list[tuple[Family, str, str]]:
    """The facts of the bundled sets: a seeded sample of each family, in a fixed order."""
    out = []
    for fam in FAMILIES:
        facts = sorted(_rng("set-facts", fam.name).sample(list(fam.facts), SET_FACTS_PER_FAMILY[fam.name]))
        out.extend((fam, s, a) for s, a in facts)
    return out


def write_jsonl(path: Path, records: Sequence[dict]) -> None:
    """Write records one JSON object per line (UTF-8, '\\n' line ends) so rebuilds are byte-identical."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def write_sets(sets_dir: Path) -> dict[str, list[dict]]:
    """Write ``paraphrase``, ``format`` and ``typo`` JSONL sets about trained facts; return the records."""
    sets = {name: [make_group(fam, s, a, name) for fam, s, a in set_facts()] for name in SET_KINDS}
    for name, records in sets.items():
        write_jsonl(sets_dir / f"{name}.jsonl", records)
    return sets


DEMO_TRAIN_FACTS = 32  # the other 8 opposites are held out entirely
DEMO_MONITOR_TRAINED = 16  # trained facts that also appear (in unseen phrasings) in the monitoring sets
# Alternative phrasings for the stability loss, deliberately unlike one another in surface form (how they
# start and end) and unlike the monitored phrasings, so that pulling them together teaches invariance to
# phrasing rather than to one template.
DEMO_GROUP_KINDS = ("canonical", "antonym", "which", "flip")


def demo_split() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Seeded split of the opposites into (trained, held-out) facts."""
    facts = list(DEMO_FAMILY.facts)
    _rng("demo-split").shuffle(facts)
    return facts[:DEMO_TRAIN_FACTS], facts[DEMO_TRAIN_FACTS:]


def write_demo(demo_dir: Path) -> dict[str, list[dict]]:
    """Write the LoRA-demo data (the "opposites" family, absent from pretraining).

    Split (40 facts, seeded):

    * ``train.jsonl``: 32 facts in ONE phrasing, the canonical "The opposite of hot is" + " cold." (the skill
      a fine-tune teaches; records ``{"prompt", "completion"}``).
    * ``groups.jsonl``: the same 32 facts as stability-loss training groups ``{"variants", "target"}`` with
      K=4 variants: canonical, "The antonym of X is", "Which word means the opposite of X?" and
      "X, and its opposite:". These templates never appear in the monitoring sets.
    * ``paraphrase.jsonl``, ``format.jsonl``, ``typo.jsonl``: monitoring sets with the same kinds as the
      bundled sets, on 24 groups: the 8 held-out facts (``meta.split = "heldout"``; no variant seen in
      training) plus 16 of the trained facts (``meta.split = "trained"``; only variant 0, the training
      phrasing, was seen). Held-out facts cannot be learned from the others (an opposite is arbitrary), so
      they measure stability, while the trained ones measure whether the fine-tune generalized across
      phrasings or memorized one.
    """
    trained, heldout = demo_split()
    train = [
        {"prompt": DEMO_FAMILY.prompt("canonical", s), "completion": f" {a}."} for s, a in trained
    ]
    groups = [
        {
            "variants": [variant(DEMO_FAMILY, kind, s, ("demo-groups", slug(s))) for kind in DEMO_GROUP_KINDS],
            "target": f" {a}.",
        }
        for s, a in trained
    ]
    monitored = [(s, a, "heldout") for s, a in heldout] + [(s, a, "trained") for s, a in trained[:DEMO_MONITOR_TRAINED]]
    out = {"train": train, "groups": groups}
    for name in SET_KINDS:
        out[name] = [make_group(DEMO_FAMILY, s, a, name, {"split": split}) for s, a, split in monitored]
    for name, records in out.items():
        write_jsonl(demo_dir / f"{name}.jsonl", records)
    return out


# ---------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which the ByteLevel pre-tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def build_tokenizer() -> Any:
    """A byte-level ``tokenizers.Tokenizer``: ids 0-2 are <pad>, <s>, </s>; byte b is id 3 + b.

    A BPE model with no merges over the 256 byte symbols splits any text into bytes, so every UTF-8 string
    round-trips; the post-processor prepends <s> (and adds no </s>), like Llama tokenizers.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    b2u = _bytes_to_unicode()
    vocab = {PAD: PAD_ID, BOS: BOS_ID, EOS: EOS_ID}
    vocab.update({b2u[b]: N_SPECIAL + b for b in range(256)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (PAD, BOS, EOS)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tok


def write_tokenizer(out: Path) -> None:
    """Save ``tokenizer.json`` and ``tokenizer_config.json`` so AutoTokenizer returns a fast tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(out / "tokenizer.json"), pretty=True)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": MODEL_SHAPE["max_position_embeddings"],
        # Left padding is what batched generation with a decoder-only model needs.
        "padding_side": "left",
        # Byte-level text must round-trip exactly; HF's clean-up would rewrite " ." and " 's".
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(out / "tokenizer_config.json", "w", encoding="utf-8", newline="\n") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")


def encode(text: str) -> list[int]:
    """Byte ids of ``text`` (no special tokens): the same ids the saved tokenizer produces."""
    return [N_SPECIAL + b for b in text.encode("utf-8")]


def build_model() -> Any:
    """A freshly initialized Llama with the tiny shape (initialization is seeded by the caller)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        **MODEL_SHAPE,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    return model


def train(model: Any, texts: Sequence[str], steps: int, batch_size: int, lr: float, log_every: int = 50) -> None:
    """A plain causal-LM loop: AdamW, linear warmup then cosine decay, loss on every non-pad token."""
    import torch

    seqs = [[BOS_ID, *encode(t), EOS_ID] for t in texts]
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, min(100, steps // 10))

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    order: list[int] = []
    t0 = time.perf_counter()
    for step in range(steps):
        if len(order) < batch_size:  # reshuffle each epoch with the seeded generator
            order += torch.randperm(len(seqs), generator=gen).tolist()
        idx, order = order[:batch_size], order[batch_size:]
        batch = [seqs[i] for i in idx]
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, s in enumerate(batch):  # right padding: positions start at 0 for every row
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % log_every == 0 or step + 1 == steps:
            print(f"step {step + 1:5d}/{steps}  loss {loss.item():.4f}  {time.perf_counter() - t0:6.1f}s", flush=True)
    model.eval()


# ---------------------------------------------------------------------------------------------------------
# Measured accuracy
# ---------------------------------------------------------------------------------------------------------


def greedy(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int = 12, batch_size: int = 64) -> list[str]:
    """Greedy continuations of ``prompts`` (batched, left padding), decoded without special tokens."""
    import torch

    outs: list[str] = []
    tokenizer.padding_side = "left"
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(list(prompts[i : i + batch_size]), return_tensors="pt", padding=True)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
        new = gen[:, enc["input_ids"].shape[1]:]
        outs.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    return outs


def is_correct(output: str, reference: str) -> bool:
    """SPEC ``prefix`` correctness: the output's normalized words start with the reference's."""
    from sago_train.functional.text import words

    ref = words(reference)
    return bool(ref) and words(output)[: len(ref)] == ref


def accuracy_table(model: Any, tokenizer: Any, sets: dict[str, list[dict]] | None) -> list[tuple[str, str, float, int]]:
    """Rows ``(scope, kind, accuracy, n)``: every fact in every phrasing kind, then each bundled set per kind."""
    rows: list[tuple[str, str, float, int]] = []
    all_kinds = list(TRAINED_KINDS) + list(HELDOUT_KINDS) + list(PERTURBATIONS)
    for kind in all_kinds:
        items = [
            (variant(fam, kind, s, ("all", fam.name, slug(s))), a) for fam in FAMILIES for s, a in fam.facts
        ]
        outs = greedy(model, tokenizer, [p for p, _ in items])
        acc = sum(is_correct(o, f" {a}") for o, (_, a) in zip(outs, items)) / len(items)
        scope = "all facts (trained)" if kind in TRAINED_KINDS else "all facts (held out)"
        rows.append((scope, kind, acc, len(items)))
    for name, records in (sets or {}).items():
        for k, kind in enumerate(SET_KINDS[name]):
            outs = greedy(model, tokenizer, [r["variants"][k] for r in records])
            acc = sum(is_correct(o, r["reference"]) for o, r in zip(outs, records)) / len(records)
            rows.append((f"set {name}", kind, acc, len(records)))
    return rows


def format_table(rows: Sequence[tuple[str, str, float, int]]) -> str:
    """A fixed-width text table of accuracy rows."""
    lines = [f"{'scope':<22} {'kind':<10} {'accuracy':>8} {'n':>4}", "-" * 47]
    lines += [f"{scope:<22} {kind:<10} {acc:>8.3f} {n:>4}" for scope, kind, acc, n in rows]
    return "\n".join(lines)


def write_model_card(out: Path, table: str | None, steps: int) -> None:
    """A README for the model folder: what it is, how it was built, and the measured accuracy."""
    text = (
        "# tiny-llama (sago_train test and demo model)\n\n"
        "A 4-layer byte-level Llama trained from scratch on synthetic facts (capitals, languages, animal\n"
        "sounds, colours, tools) by `scripts/build_tiny_model.py`. Only the `canonical`, `alt` and `alt2`\n"
        "phrasings were trained; other phrasings are held out, so it is deliberately unstable across variants.\n"
        "Not a useful language model: it exists to make SAGO's numbers move in tests and demos.\n\n"
        f"Build: seed {SEED}, {steps} steps, CPU, fp32.\n"
    )
    if table:
        text += f"\nGreedy accuracy per phrasing kind (measured at build time):\n\n```\n{table}\n```\n"
    (out / "README.md").write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model folder (default: the package assets)")
    ap.add_argument("--steps", type=int, default=1200, help="training steps (default 1200: the loss plateaus by ~1000)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--sets-dir", type=Path, default=DEFAULT_SETS, help="where the bundled sets go")
    ap.add_argument("--demo-dir", type=Path, default=DEFAULT_DEMO, help="where the demo data goes")
    ap.add_argument("--sets-only", action="store_true", help="rewrite sets and demo data only; no training")
    ap.add_argument("--no-sets", action="store_true", help="do not write sets or demo data")
    ap.add_argument("--no-eval", action="store_true", help="skip the accuracy table at the end")
    args = ap.parse_args(argv)

    sets = None
    if not args.no_sets:
        sets = write_sets(args.sets_dir)
        demo = write_demo(args.demo_dir)
        print(f"wrote {', '.join(sets)} sets ({len(next(iter(sets.values())))} groups each) to {args.sets_dir}")
        print(f"wrote demo data ({', '.join(f'{k}: {len(v)}' for k, v in demo.items())}) to {args.demo_dir}")
    if args.sets_only:
        return 0

    import torch

    # One thread and deterministic kernels: the same checkout gives byte-identical weights on a given CPU
    # (thread count changes the summation order of matrix products).
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    random.seed(SEED)

    texts = training_texts()
    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"training {n_params:,} parameters on {len(texts)} sequences for {args.steps} steps")
    t0 = time.perf_counter()
    train(model, texts, args.steps, args.batch_size, args.lr)
    train_s = time.perf_counter() - t0

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    write_tokenizer(args.out)
    # save_pretrained writes the weights through a private (0600) temporary file; make them readable like
    # the other package data.
    (args.out / "model.safetensors").chmod(0o644)
    size = (args.out / "model.safetensors").stat().st_size
    print(f"saved to {args.out} (model.safetensors {size / 1e6:.2f} MB); training took {train_s:.0f}s")

    table = None
    if not args.no_eval:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # Measure the saved artifact through the public loading path, not the in-memory model.
        loaded = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.out)
        if sets is None:
            sets = {name: [make_group(fam, s, a, name) for fam, s, a in set_facts()] for name in SET_KINDS}
        table = format_table(accuracy_table(loaded, tokenizer, sets))
        print("\ngreedy accuracy per phrasing kind\n" + table)
    write_model_card(args.out, table, args.steps)
    print(f"total {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
