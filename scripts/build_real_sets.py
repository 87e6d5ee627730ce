"""Build the bundled real-model variant sets (``sago_train/assets/sets/real/*.jsonl``).

Four sets of questions with short references, for ``sago://smollm2-135m-instruct`` (an instruct model, fed
through its chat template) and ``sago://gemma-3-270m`` (a base model, fed plain completions) alike: capitals,
science, arithmetic, opposites. Every variant is a **few-shot completion**: two solved questions of the same
family, then the question, in a ``Question: ...\nAnswer:`` scaffold. A base model given a bare question
repeats it or starts a forum thread; given the scaffold it answers and goes on with a new "Question:", where
the default stops of the answer span end its answer. An instruct model answers the last question.

Every group has the kinds ``canonical`` (the question), ``paraphrase`` (a hand-written rewording),
``format`` (the same shots and question in a ``Q: ...\nA:`` scaffold, lowercase) and ``typo`` (character
noise on the question from :class:`~sago_train.data.generators.TypoGenerator`, seeded per group). A reference
may list aliases ("carbon dioxide", "CO2"). Deterministic: rerunning writes the same files.

    python scripts/build_real_sets.py
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from sago_train.data.generators import TypoGenerator

OUT = Path(__file__).resolve().parent.parent / "sago_train" / "assets" / "sets" / "real"
KINDS = ["canonical", "paraphrase", "format", "typo"]
TYPO = TypoGenerator(rate=0.06)

CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
    ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Australia", "Canberra"),
    ("China", "Beijing"), ("India", "New Delhi"), ("Brazil", ["Brasilia", "Brasília"]), ("Mexico", "Mexico City"),
    ("Argentina", "Buenos Aires"), ("Portugal", "Lisbon"), ("Greece", "Athens"), ("Turkey", "Ankara"),
    ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Hungary", "Budapest"), ("Sweden", "Stockholm"),
    ("Norway", "Oslo"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Ireland", "Dublin"),
    ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Colombia", ["Bogota", "Bogotá"]),
    ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"), ("South Korea", "Seoul"), ("Indonesia", "Jakarta"),
    ("Nigeria", "Abuja"), ("Morocco", "Rabat"), ("Switzerland", "Bern"), ("Belgium", "Brussels"),
    ("the Netherlands", "Amsterdam"), ("Cuba", "Havana"), ("Iran", "Tehran"), ("Iraq", "Baghdad"),
    ("Saudi Arabia", "Riyadh"), ("Czech Republic", "Prague"), ("New Zealand", "Wellington"), ("Pakistan", "Islamabad"),
]

# (question, paraphrase, reference)
SCIENCE = [
    ("What gas do plants absorb from the air?", "Which gas is taken in by plants from the atmosphere?", ["carbon dioxide", "CO2"]),
    ("What gas do humans need to breathe?", "Which gas must people breathe in to live?", "oxygen"),
    ("What is the chemical symbol for gold?", "Which chemical symbol stands for gold?", "Au"),
    ("What is the chemical symbol for water?", "How is water written as a chemical formula?", ["H2O", "H₂O"]),
    ("Which planet is closest to the Sun?", "Name the planet nearest to the Sun.", "Mercury"),
    ("Which planet is known as the Red Planet?", "What planet is called the Red Planet?", "Mars"),
    ("What is the largest planet in our solar system?", "Which planet in the solar system is the biggest?", "Jupiter"),
    ("What star is at the center of our solar system?", "Which star lies at the middle of the solar system?", "Sun"),
    ("What is the hardest natural substance?", "Which natural material is the hardest?", "diamond"),
    ("What organ pumps blood through the body?", "Which organ pushes blood around the body?", "heart"),
    ("What organ do humans use to think?", "With which organ do people think?", "brain"),
    ("What do bees make?", "What food is produced by bees?", "honey"),
    ("What is frozen water called?", "What do we call water that has frozen?", "ice"),
    ("What force pulls objects toward the Earth?", "Which force makes things fall to the ground?", "gravity"),
    ("What is the closest star to the Earth?", "Which star is nearest to our planet?", "Sun"),
    ("What natural satellite orbits the Earth?", "What is the name of Earth's natural satellite?", "Moon"),
    ("What part of the plant makes food using sunlight?", "Which part of a plant uses sunlight to make food?", ["leaf", "leaves"]),
    ("What color is the sky on a clear day?", "On a clear day, what colour is the sky?", "blue"),
    ("What is the main gas in the air we breathe?", "Which gas makes up most of the air?", "nitrogen"),
    ("What metal is liquid at room temperature?", "Which metal is a liquid at room temperature?", "mercury"),
    ("What do caterpillars turn into?", "What does a caterpillar become?", "butterfly"),
    ("What animal is the largest mammal?", "Which mammal is the biggest of all?", "whale"),
    ("What is the fastest land animal?", "Which land animal runs the fastest?", "cheetah"),
    ("What is the tallest animal?", "Which animal is the tallest?", "giraffe"),
    ("What do we call animals that eat only plants?", "What is the name for animals that only eat plants?", ["herbivores", "herbivore"]),
    ("What do we call animals that eat only meat?", "What is the name for animals that only eat meat?", ["carnivores", "carnivore"]),
    ("What is the center of an atom called?", "What is the middle part of an atom called?", "nucleus"),
    ("What particle has a negative charge?", "Which particle carries a negative charge?", "electron"),
    ("What instrument measures temperature?", "Which tool is used to measure temperature?", "thermometer"),
    ("What is the study of living things called?", "What science studies living things?", "biology"),
    ("What is the study of the stars and planets called?", "Which science studies stars and planets?", "astronomy"),
    ("What is the largest organ of the human body?", "Which organ of the human body is the largest?", "skin"),
    ("What blood cells fight infection?", "Which blood cells protect the body against infection?", ["white blood cells", "leukocytes"]),
    ("How many bones are in the adult human body?", "How many bones does an adult human have?", "206"),
    ("What is the chemical symbol for iron?", "Which chemical symbol stands for iron?", "Fe"),
    ("What is the chemical symbol for sodium?", "Which chemical symbol stands for sodium?", "Na"),
    ("What type of energy comes from the Sun?", "What kind of energy does the Sun give us?", "solar"),
    ("What is the process by which plants make food?", "What is the name of the process plants use to make food?", "photosynthesis"),
    ("What gas do humans breathe out?", "Which gas do people exhale?", ["carbon dioxide", "CO2"]),
    ("What is the freezing point of water in degrees Celsius?", "At how many degrees Celsius does water freeze?", "0"),
    ("What layer of gas protects the Earth from ultraviolet rays?", "Which layer of the atmosphere blocks ultraviolet light?", "ozone"),
    ("What is the largest ocean on Earth?", "Which ocean on Earth is the biggest?", "Pacific"),
    ("What is the longest river in the world?", "Which river in the world is the longest?", "Nile"),
    ("What is the name of our galaxy?", "Which galaxy do we live in?", "Milky Way"),
]

# (word, opposite)
OPPOSITES = [
    ("hot", "cold"), ("big", ["small", "little"]), ("up", "down"), ("happy", "sad"), ("fast", "slow"), ("light", "dark"),
    ("open", ["closed", "shut"]), ("early", "late"), ("rich", "poor"), ("strong", "weak"), ("hard", "soft"),
    ("old", "young"), ("high", "low"), ("full", "empty"), ("wet", "dry"), ("loud", ["quiet", "silent"]), ("thick", "thin"),
    ("good", "bad"), ("true", "false"), ("clean", "dirty"), ("heavy", "light"), ("long", "short"),
    ("win", "lose"), ("day", "night"), ("begin", ["end", "finish"]), ("inside", "outside"), ("push", "pull"),
    ("friend", "enemy"), ("buy", "sell"), ("love", "hate"), ("north", "south"), ("east", "west"),
    ("left", "right"), ("question", "answer"), ("laugh", "cry"), ("remember", "forget"), ("accept", ["reject", "refuse"]),
    ("arrive", ["leave", "depart"]), ("cheap", "expensive"), ("brave", ["afraid", "cowardly", "scared"]), ("ancient", "modern"), ("sweet", "sour"),
    ("generous", "selfish"), ("victory", "defeat"), ("increase", "decrease"),
]


# Two solved questions per set, shown before every question (none of them is a question of the set).
SHOTS = {
    "capitals": [("What is the capital of Uruguay?", "Montevideo"), ("What is the capital of Jamaica?", "Kingston")],
    "science": [("What color are healthy leaves?", "green"), ("What do cows drink?", "water")],
    "arithmetic": [("What is 3 + 4?", "7"), ("What is 9 - 3?", "6")],
    "opposites": [("What is the opposite of 'near'?", "far"), ("What is the opposite of 'yes'?", "no")],
}
# The canonical scaffold, and the format kind's.
SCAFFOLDS = {"canonical": ("Question", "Answer"), "format": ("Q", "A")}


def _rng(set_name: str, gid: str) -> random.Random:
    return random.Random(int(hashlib.sha256(f"real-sets:{set_name}:{gid}".encode()).hexdigest()[:16], 16))


def few_shot(set_name: str, question: str, scaffold: str = "canonical") -> str:
    q, a = SCAFFOLDS[scaffold]
    shots = [f"{q}: {sq}\n{a}: {sa}" for sq, sa in SHOTS[set_name]]
    return "\n\n".join([*shots, f"{q}: {question}\n{a}:"])


def group(set_name: str, gid: str, question: str, paraphrase: str, reference: str | list[str]) -> dict:
    typo = TYPO.perturb(question, _rng(set_name, gid))
    return {
        "id": gid,
        "variants": [few_shot(set_name, question), few_shot(set_name, paraphrase),
                     few_shot(set_name, question, "format"), few_shot(set_name, typo)],
        "kinds": KINDS,
        "reference": reference,
        "meta": {"family": set_name},
    }


def arithmetic() -> list[dict]:
    """Small sums, differences and easy products: a 135M model gets some right, not most."""
    rng = random.Random("real-sets:arithmetic")
    rows, seen = [], {(3, "plus", 4), (9, "minus", 3)}  # the shots
    while len(rows) < 45:
        op = rng.choice(["plus", "plus", "minus", "times"])
        if op == "times":
            a, b = rng.choice([2, 10]), rng.randint(3, 9)
            value, sym, para = a * b, "*", f"If you multiply {a} by {b}, what do you get?"
        elif op == "plus":
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            value, sym, para = a + b, "+", f"If you add {a} and {b}, what do you get?"
        else:
            a, b = rng.randint(5, 12), rng.randint(1, 4)
            value, sym, para = a - b, "-", f"If you take {b} away from {a}, what is left?"
        # "contains" matching would count an answer that merely repeats the question (8 - 4 = 4): the
        # reference must not be one of the operands.
        if (a, op, b) in seen or value in (a, b):
            continue
        seen.add((a, op, b))
        rows.append(group("arithmetic", f"{op}-{a}-{b}", f"What is {a} {sym} {b}?", para, str(value)))
    return rows


def build() -> dict[str, list[dict]]:
    return {
        "capitals": [
            group("capitals", f"capital-{c.lower().replace(' ', '-')}", f"What is the capital of {c}?",
                  f"Which city is the capital city of {c}?", cap)
            for c, cap in CAPITALS
        ],
        "science": [group("science", f"science-{i:02d}", q, p, r) for i, (q, p, r) in enumerate(SCIENCE)],
        "arithmetic": arithmetic(),
        "opposites": [
            group("opposites", f"opposite-{w}", f"What is the opposite of '{w}'?",
                  f"Which word means the reverse of '{w}'?", o)
            for w, o in OPPOSITES
        ],
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in build().items():
        with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} groups -> {OUT / (name + '.jsonl')}")


if __name__ == "__main__":
    main()
