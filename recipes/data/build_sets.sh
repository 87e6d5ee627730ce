#!/usr/bin/env bash
# Rebuild every variant set the GPU recipes use, from the plain examples in recipes/data/ (seeded and
# deterministic: the committed files are exactly what these commands write; tests/test_recipes.py checks it).
#   heldout_examples.jsonl  20 held-out instructions in the Alpaca prompt format, each with a short reference
#   train_examples.jsonl    40 other instructions, the training groups of the stability recipe
# Run from anywhere, with sago-train on PATH (e.g. after `source .venv/bin/activate`): bash recipes/data/build_sets.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

# Monitoring sets (both recipes): 3 variants per group.
#   paraphrase: another prompt template and another preamble (kinds canonical, template, instruction)
sago-train variants --input recipes/data/heldout_examples.jsonl --out recipes/data/sets/paraphrase.jsonl --templates recipes/data/templates.yaml --instructions recipes/data/instructions.yaml --seed 0
#   format: FormatSpread-style separators/casing/joiners and extra whitespace (canonical, format, whitespace)
sago-train variants --input recipes/data/heldout_examples.jsonl --out recipes/data/sets/format.jsonl --format --whitespace --seed 0
#   noise: character typos and lower-casing (canonical, typo, casing)
sago-train variants --input recipes/data/heldout_examples.jsonl --out recipes/data/sets/noise.jsonl --typo-rate 0.05 --casing lower --seed 0

# Training groups of the stability recipe: 4 variants per group sharing the reference as the target
# (kinds canonical, format, typo, casing); the paraphrase kinds stay unseen in training.
sago-train variants --input recipes/data/train_examples.jsonl --out recipes/data/sets/train_groups.jsonl --format --typo-rate 0.05 --casing lower --seed 1
