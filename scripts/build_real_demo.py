"""Build the data of ``make demo-real`` (``sago_train/assets/demo-real/``): made-up capitals of made-up
countries, which SmolLM2-135M-Instruct cannot know, taught in training phrasings and monitored on held-out
phrasings of the same facts (paraphrase, format, typo). Deterministic.

    python scripts/build_real_demo.py
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from sago_train.data.generators import TypoGenerator

OUT = Path(__file__).resolve().parent.parent / "sago_train" / "assets" / "demo-real"
FACTS = [
    ("Zorvania", "Quellburg"), ("Valdoria", "Minsethal"), ("Kestrany", "Parovik"), ("Ulmeria", "Dravenport"),
    ("Brisoland", "Telmark"), ("Norvessa", "Calderin"), ("Ombralia", "Fenholm"), ("Quintara", "Lysmoor"),
    ("Drakmoria", "Harrowmere"), ("Selvania", "Irongale"), ("Pellucia", "Virenne"), ("Trovekia", "Amberlund"),
    ("Marvosia", "Kolbeck"), ("Estavia", "Rhennport"), ("Glimmora", "Ostvale"), ("Fendaria", "Sarnoval"),
    ("Caldonesia", "Brightmarsh"), ("Helvoria", "Tessaly"), ("Rostania", "Pinemorrow"), ("Lorivia", "Castelmoor"),
    ("Brenthia", "Undervale"), ("Sarkovia", "Mirelund"), ("Altruria", "Westhollow"), ("Nymeria", "Goldharrow"),
]
TYPO = TypoGenerator(rate=0.08)


def canonical(country: str) -> str:
    return f"What is the capital of {country}?"


def train_group(country: str, capital: str) -> dict:
    # Message lists: the collator renders them with the model's chat template, as evaluation renders prompts.
    phrasings = [canonical(country), f"Name the capital city of {country}.", f"Which city is {country}'s capital?",
                 f"Tell me the capital of {country}."]
    return {"id": f"train-{country.lower()}", "variants": [[{"role": "user", "content": p}] for p in phrasings],
            "target": f"The capital of {country} is {capital}.<|im_end|>"}


def _rng(country: str, k: int) -> random.Random:
    return random.Random(int(hashlib.sha256(f"demo-real:{country}:{k}".encode()).hexdigest()[:16], 16))


def monitor_sets() -> dict[str, list[dict]]:
    sets: dict[str, list[dict]] = {"paraphrase": [], "format": [], "typo": []}
    for country, capital in FACTS:
        q = canonical(country)
        base = {"reference": capital, "meta": {"family": "made-up capital"}}
        sets["paraphrase"].append({
            "id": f"paraphrase-{country.lower()}", "kinds": ["canonical", "seat", "based", "serves"],
            "variants": [q, f"{country}'s seat of government is in which city?",
                         f"In which city is the government of {country} based?",
                         f"What city serves as the capital of {country}?"], **base})
        sets["format"].append({
            "id": f"format-{country.lower()}", "kinds": ["canonical", "qa", "terse", "upper"],
            "variants": [q, f"Question: {q}\nAnswer:", f"Q: capital of {country}?\nA:",
                         f"WHAT IS THE CAPITAL OF {country.upper()}?"], **base})
        sets["typo"].append({
            "id": f"typo-{country.lower()}", "kinds": ["canonical", "typo-1", "typo-2", "typo-3"],
            "variants": [q, *(TYPO.perturb(q, _rng(country, k)) for k in range(3))], **base})
    return sets


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    files = {"train": [train_group(c, cap) for c, cap in FACTS], **monitor_sets()}
    for name, rows in files.items():
        with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} -> {OUT / (name + '.jsonl')}")


if __name__ == "__main__":
    main()
