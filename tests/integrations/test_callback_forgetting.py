"""A model that forgets its task reads as more stable (a consistently wrong model is perfectly stable): the
callback must say so, with an accuracy verdict beside every stability verdict, in the log and in the history;
``compare`` of its checkpoints and ``report`` of the run must say it too (docs/accuracy.md).

Built on the shipped tiny model, which knows capitals: fine-tuned to answer " Brum." to every capital prompt
("The capital of France is Brum."), its capitals accuracy falls while its generations agree more."""

from __future__ import annotations

import json
import logging

import pytest

from sago_train import SAGOCallback, StabilityConfig, StabilityTrainer, bundled_sets, load_tiny_model
from sago_train.results.wording import CONSISTENTLY_WRONG, DEGENERATE_WORDS

from .._helpers.results_dirs import run_cli

SET = "paraphrase"


@pytest.mark.slow
def test_forgetting_gives_an_accuracy_verdict_and_a_warning(tmp_path, caplog, capsys):
    from transformers import TrainingArguments

    model, tok = load_tiny_model()
    monitored = bundled_sets()[SET]
    capitals = [g for g in monitored.groups if g.id.startswith("capital-")][:16]
    groups = [{"variants": list(g.variants), "target": " Brum."} for g in capitals]
    cb = SAGOCallback({SET: monitored}, eval_steps=40, generation_every=1, max_groups=0, max_new_tokens=6,
                      n_bootstrap=500)
    args = TrainingArguments(str(tmp_path), max_steps=40, per_device_train_batch_size=4, learning_rate=5e-3,
                             lr_scheduler_type="constant", report_to=[], save_strategy="no", use_cpu=True,
                             disable_tqdm=True, remove_unused_columns=False, logging_steps=10, seed=0)
    trainer = StabilityTrainer(model=model, args=args, train_dataset=groups, processing_class=tok,
                               stability_config=StabilityConfig(act_weight=0.0, conf_weight=0.0,
                                                                task_loss_variants="all"))
    cb.attach(trainer)
    with caplog.at_level(logging.INFO, logger="sago_train"):
        trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "sago" / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in lines] == [0, 40]
    final = lines[-1]
    before, after = lines[0]["correctness"][SET]["accuracy"], final["correctness"][SET]["accuracy"]
    assert after < before - 0.2, (before, after)  # it forgot
    acc = final["compare"][SET]["accuracy"]["vs_baseline"]
    assert acc["verdict"] == "worse" and acc["p_worse"] < 0.05  # the accuracy verdict, in the history
    # ...while generation agrees more: but this model also collapsed (one answer to most questions), so that is
    # "degenerate outputs", never "better" (docs/validity.md)
    assert final["compare"][SET]["generation"]["vs_baseline"]["verdict"] == "degenerate outputs"
    # In the Trainer log: the accuracy change beside the axes' (every number reaches the Trainer's metrics).
    metrics = cb.last_metrics
    assert metrics[f"eval_sago/{SET}/accuracy_vs_baseline"] == pytest.approx(acc["mean_diff"])
    assert metrics[f"eval_sago/{SET}/accuracy_vs_baseline_p"] == pytest.approx(acc["p_worse"])
    messages = [r.getMessage() for r in caplog.records]
    warning = [m for m in messages if f"accuracy on set '{SET}' fell significantly since the baseline" in m]
    assert len(warning) == 1 and "forgetting" in warning[0]
    change = [m for m in messages if m.startswith(f"sago step 40, set '{SET}' vs the baseline (step 0):")]
    assert len(change) == 1
    assert "generation" in change[0] and "degenerate, not stability" in change[0] and "more stable" not in change[0]
    assert "accuracy" in change[0] and "less accurate (p" in change[0]
    summary = [m for m in messages if m.startswith(f"  set '{SET}': ")]
    assert len(summary) == 1 and "accuracy" in summary[0] and "-> final" in summary[0]
    # compare of the two checkpoints: the forgetting one ranks first on generation, with its accuracy beside
    # it and the line that says it is less accurate than the untrained one.
    from sago_train.analysis.compare import compare_evaluations, load_sources

    first, untrained = f"{tmp_path.name}@40", f"{tmp_path.name}@0"
    result = compare_evaluations(load_sources([f"{tmp_path}@0", f"{tmp_path}@40"], last_only=True))
    assert result["axes"]["generation"]["ranks"][SET][first] == 1
    scores = result["accuracy"]["scores"][SET]
    assert scores[first]["accuracy"]["mean"] == pytest.approx(after)
    assert scores[untrained]["accuracy"]["mean"] == pytest.approx(before)
    check = next(c for c in result["accuracy"]["checks"] if c["axis"] == "generation")
    assert (check["first"], check["other"], check["words"]) == (first, untrained, CONSISTENTLY_WRONG)
    assert check["accuracy"]["p_worse"] == pytest.approx(acc["p_worse"])  # the history's test, same numbers
    code, out, err = run_cli(["compare", f"{tmp_path}@0", f"{tmp_path}@40"], capsys)
    assert code == 0, err
    assert f"generation: {first} ranks first but is less accurate than {untrained}" in " ".join(out.split())
    # report of the run: the change since the baseline reads the history's own verdicts (the training log's:
    # degenerate outputs, never "more stable"; before #31 it decided again from the numbers and said "consistently
    # wrong?"), and warns that accuracy fell.
    code, out, err = run_cli(["report", str(tmp_path)], capsys)
    assert code == 0, err
    md = (tmp_path / "sago" / "report" / "report.md").read_text()
    since = md[md.index("### Change since the baseline"):md.index("## Per-group")]
    rows = {line.split(" | ")[2]: line for line in since.splitlines() if line.startswith(f"| {tmp_path.name} | {SET} |")}
    assert rows["generation"].endswith(f"| {DEGENERATE_WORDS} |") and rows["accuracy"].endswith("| less accurate |")
    assert f"**Warning**: accuracy of `{tmp_path.name}` on set `{SET}` fell significantly since the baseline" in md
