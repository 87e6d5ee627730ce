"""docs/study.md's measured study: the committed report's findings are computed from the committed evaluations
(benchmarks/results/study), and every table and count the page quotes is the committed one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sago_train.analysis.compare import load_sources
from sago_train.analysis.report_findings import (
    findings_markdown,
    relations_from_records,
    reliability_of,
)
from tests._helpers.scripts import script_module

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "study"
ENTRIES = ("smollm2", "gemma", "smollm2-canonical", "smollm2-augment")


@pytest.fixture(scope="module")
def evals():
    return load_sources([str(RESULTS / e) for e in ENTRIES], last_only=True)


@pytest.fixture(scope="module")
def doc():
    return (ROOT / "docs" / "study.md").read_text()


def test_the_committed_findings_are_computed_from_the_committed_evaluations(evals):
    report = (RESULTS / "report.md").read_text()
    assert "\n".join(findings_markdown(evals)).strip() in report


def test_the_page_quotes_the_committed_tables(doc):
    report = (RESULTS / "report.md").read_text()
    for name in ("arithmetic", "capitals", "opposites", "science"):
        start = report.index(f"### set `{name}`\n\n") + len(f"### set `{name}`\n\n")
        assert report[start: report.index("\n\n", start)] in doc, name
    power = (RESULTS / "power.md").read_text().rstrip("\n")
    assert power in doc


def test_the_page_quotes_the_committed_counts(evals, doc):
    text = " ".join(doc.split())
    family = reliability_of(evals)
    verdicts = Counter(v.verdict() for v in family.values())
    assert f"Of the {len(family)} model x set x axis cells tested together (Holm), {verdicts['not noise']} are" in text
    rel = Counter(r.verdict for r in relations_from_records(evals))
    assert (f"Of {sum(rel.values())} pairs (entry x set x pair of axes), {rel['related']} are related, "
            f"{rel['distinct']} distinct and {rel['inconclusive']} inconclusive") in text
    cmp = json.loads((RESULTS / "comparison.json").read_text())
    fam = cmp["families"]["axes"]
    means = sum(len(r["flips"]) for a, r in cmp["axes"].items() if a != "instability")
    assert f"Of the {fam['tested']} flips that could occur" in text and f"**{fam['robust']} are robust**" in text
    assert f"{means} occur in the means" in text


def test_the_power_table_was_computed_at_this_studys_sizes(evals):
    """The sizes in power.json against the ones the committed report corrected over, read another way: the
    reliability and relations families as their tests record them, the flips' as comparison.json does, and the
    fewest groups of a set from the evaluations' summaries."""
    sizes = json.loads((RESULTS / "power.json").read_text())["sizes"]
    tested = [r for r in reliability_of(evals).values() if not r.same_as and not r.note]
    assert sizes["reliability"] == tested[0].family == len(tested) == 64
    assert sizes["relations"] == relations_from_records(evals)[0].family == 96
    assert sizes["flips"] == json.loads((RESULTS / "comparison.json").read_text())["families"]["axes"]["tested"]
    summaries = [json.loads((RESULTS / e / "summary.json").read_text()) for e in ENTRIES]
    assert sizes["groups"] == min(s["n_groups"] for d in summaries for s in d["sets"].values()) == 44


def test_the_power_table_restates_its_json():
    with script_module("benchmarks/study_power.py") as module:
        result = json.loads((RESULTS / "power.json").read_text())
        assert module.markdown(result) == (RESULTS / "power.md").read_text()
