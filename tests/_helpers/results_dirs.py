"""Synthetic result directories (eval and run directories) and the CLI runner, shared by the report and
compare tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sago_train.cli.main import main
from sago_train.functional import stats

AXES = ("activation", "confidence", "generation", "mirroring")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------------------
# Synthetic result directories (also used by test_compare)
# ---------------------------------------------------------------------------------------------------------------


def _records(values: dict[str, list[float]], correct: bool | None = None) -> list[dict]:
    n = len(next(iter(values.values())))
    out = []
    for i in range(n):
        axes = {a: v[i] for a, v in values.items()}
        out.append({"id": f"g{i}", "variants": [f"v{i} a", f"v{i} b"], "kinds": ["canonical", "other"],
                    "outputs": ["x", "y"], "reference": " r", "scored_reference": " r", "axes": axes,
                    "instability": float(np.mean(list(axes.values()))),
                    "per_variant": {a: [x, x] for a, x in axes.items()}, "logprobs": [-1.0, -1.2],
                    "correct": None if correct is None else [correct, correct], "extra": {}})
    return out


def _set_summary(values: dict[str, list[float]]) -> dict:
    entry = {a: stats.bootstrap_ci(v, n_resamples=200).to_dict() for a, v in values.items()}
    entry["instability"] = stats.bootstrap_ci(np.mean([v for v in values.values()], axis=0),
                                              n_resamples=200).to_dict()
    return entry


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def write_eval_dir(path: Path, sets: dict[str, dict[str, list[float]]], *, model: str = "m",
                   accuracy: float | None = 0.5, records: bool = True) -> Path:
    """An eval dir as `sago-train eval --out` writes it: summary.json + one <set>.jsonl per set."""
    summary_sets = {}
    for name, values in sets.items():
        entry = _set_summary(values)
        n = len(next(iter(values.values())))
        summary_sets[name] = {
            "n_groups": n, "skipped": {}, "axes": {a: entry[a] for a in values}, "instability": entry["instability"],
            "correctness": {} if accuracy is None else {"n": n, "accuracy": accuracy},
            "kinds": {}, "axis_correlation": {},
        }
        if records:
            _write_jsonl(path / f"{name}.jsonl", _records(values))
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps({"sago_train_version": "0", "model": model, "config": {},
                                                   "sets": summary_sets, "instability": {},
                                                   "axis_correlation": {}}))
    return path


def write_run_dir(path: Path, steps: dict[int, dict[str, dict[str, list[float]]]],
                  accuracy: float = 0.25) -> Path:
    """A run dir as SAGOCallback writes it: sago/history.jsonl + sago/step-<step>/<set>.jsonl."""
    lines = []
    for step, sets in sorted(steps.items()):
        lines.append({"step": step, "epoch": step / 10, "sets": {s: _set_summary(v) for s, v in sets.items()},
                      "baseline": step == min(steps), "compare": {},
                      "correctness": {s: {"n": len(next(iter(v.values()))), "accuracy": accuracy}
                                      for s, v in sets.items()},
                      "runtime_s": 0.1})
        for s, values in sets.items():
            _write_jsonl(path / "sago" / f"step-{step}" / f"{s}.jsonl", _records(values))
    _write_jsonl(path / "sago" / "history.jsonl", lines)
    return path


def axis_values(seed: int, n: int = 12, shift: float = 0.0) -> dict[str, list[float]]:
    """Per-group values of the four axes (mirroring constant 0, as on a tiny model)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.1, 0.6, size=n)
    return {
        "activation": list(np.clip(base + shift, 0, 1)),
        "confidence": list(rng.uniform(0.0, 0.3, size=n)),
        "generation": list(np.clip(base + rng.normal(0, 0.1, n), 0, 1)),
        "mirroring": [0.0] * n,
    }


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_SIGNATURE), path


def assert_report(out: Path, expected_pngs: list[str]) -> str:
    md = (out / "report.md").read_text()
    for name in expected_pngs:
        assert_png(out / name)
        assert f"]({name})" in md, name  # embedded by a relative path
    # Every image the report references exists.
    for ref in [line.split("](")[1].rstrip(")") for line in md.splitlines() if line.startswith("![")]:
        assert (out / ref).is_file(), ref
    return md


# ---------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------
