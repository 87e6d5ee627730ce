"""The table of docs/real-models.md: one row per model and set from ``sago-train eval --out DIR`` folders.

Accuracy is per variant on the answer span; "canonical" is the canonical kind's accuracy, "typo" the typo kind's,
with a 95% percentile-bootstrap CI over groups (seed 0, as the evaluator's); the axes are the summary's means
with their CIs.

    python scripts/real_models_table.py runs/real-eval/gemma-3-270m runs/real-eval/smollm2-135m-instruct
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sago_train.functional.stats import bootstrap_ci

AXES = ("generation", "mirroring", "confidence", "activation_rel")


def _ci(summary: dict) -> str:
    return f"{summary['mean']:.3f} [{summary['ci_low']:.3f}, {summary['ci_high']:.3f}]"


def _kind_accuracy(records: list[dict], kind: str) -> str:
    values = [float(r["correct"][r["kinds"].index(kind)]) for r in records if r.get("correct") is not None]
    s = bootstrap_ci(values, seed=0)
    return f"{s.mean:.2f} [{s.ci_low:.2f}, {s.ci_high:.2f}]"


def rows(folder: Path) -> list[str]:
    summary = json.loads((folder / "summary.json").read_text())
    model = summary["model"].removeprefix("sago://")
    out = []
    for name, s in summary["sets"].items():
        records = [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines() if line.strip()]
        acc = s["correctness"]
        cells = [model, name, str(s["n_groups"]), _kind_accuracy(records, "canonical"), _kind_accuracy(records, "typo"),
                 f"{acc['accuracy']:.2f} [{acc['accuracy_ci_low']:.2f}, {acc['accuracy_ci_high']:.2f}]",
                 *(_ci(s["axes"][a]) for a in AXES)]
        out.append("| " + " | ".join(cells) + " |")
    return out


def main() -> None:
    print("| model | set | groups | canonical accuracy | typo accuracy | accuracy, all variants | "
          + " | ".join(AXES) + " |")
    print("|---|---|---:|---:|---:|---:|" + "---:|" * len(AXES))
    for arg in sys.argv[1:]:
        print("\n".join(rows(Path(arg))))


if __name__ == "__main__":
    main()
