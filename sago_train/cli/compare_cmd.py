"""``sago-train compare``: rank models or checkpoints per set and find rank reversals between sets."""

from __future__ import annotations

import argparse
from typing import Any

from ..analysis.ranking import reversal_headline
from ..errors import SagoInputError
from ..formatting import fmt_num
from ..functional.multiplicity import NOT_ENOUGH_TO_TEST
from ..io import atomic_write_json, check_output_path


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compare",
        help="rank models/checkpoints per set; two entries: the paired verdict per set and quantity; more: "
        "Kendall's tau and rank reversals between sets",
        description="Two entries (base vs fine-tune): the second against the first per set and quantity, groups "
        "paired by id (difference, 95%% CI, one-sided Wilcoxon p, verdict), beside the rankings. "
        "Rank evaluations per variant set on each axis (lower instability = better; accuracy: "
        "higher = better), with Kendall's tau between the sets' rankings and the pairs whose order flips from one "
        "set to another. A directory is an evaluation directory ('sago-train eval --out') or a training run's "
        "output_dir (its last evaluation); RUN_DIR@STEP picks the evaluation at that step, so checkpoints of one "
        "run can be compared. Every entry is scored on the groups of each set that all entries evaluated (the "
        "first lines of the output say how many and which were dropped); where the groups cannot be matched (no "
        "per-group records, or no group in common) it refuses unless --allow-different-groups. A flip is robust "
        "when the paired tests on both sets show the reversal (one-sided Wilcoxon and the 95%% paired-bootstrap CI, "
        "the verdict rule of report and the training callback), Holm-corrected over every entry pair x set pair x "
        "axis that could flip, so a comparison of entries that do not differ prints a robust flip at most 5%% of the "
        "time; instability (a mean of the other axes) is corrected apart (docs/findings.md). Every stability ranking "
        "shows each entry's accuracy with its 95%% CI beneath its rank, and a line where the entry ranked first is "
        "significantly less accurate than another (a consistently wrong model is perfectly stable).",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="at least 2 evaluation or run directories (RUN_DIR@STEP)")
    p.add_argument("--axis", dest="axes", action="append", metavar="AXIS",
                   help="axis to rank on (repeatable; also 'instability' or 'accuracy'); default: every recorded "
                   "axis and instability")
    p.add_argument("--allow-different-groups", action="store_true",
                   help="where a set's groups cannot be matched across the entries (an entry without per-group "
                   "records, or no group in common), rank each entry on its own groups instead of refusing; the "
                   "first lines of the output say so")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="also write the result as JSON")
    p.set_defaults(func=run)
    return p


def print_comparison(result: dict[str, Any], console: Any) -> None:
    """First what each set is scored on (the common groups, or not); then rich tables: the entries, and per axis
    the scores with ranks (each entry's accuracy beneath, and a line for an entry ranked first that is
    significantly less accurate than another: docs/accuracy.md), Kendall's tau and the flips."""
    from rich.table import Table

    from ..analysis.accuracy_beside import cell_text
    from ..results.wording import ACCURACY, ACCURACY_QUANTITIES
    from .console import user_text as esc

    for line in result.get("scope", []):
        console.print(esc(line))
    entries = Table(title="entries", title_justify="left")
    for col in ("label", "kind", "step", "directory", "model"):
        entries.add_column(col)
    for e in result["entries"]:
        entries.add_row(esc(e["label"]), esc(e["kind"]), "-" if e["step"] is None else str(e["step"]),
                        esc(e["path"]), esc(e["model"] or "-"))
    console.print(entries)
    labels = [e["label"] for e in result["entries"]]
    families = result.get("families", {})
    beside = result.get("accuracy") or {}  # docs/accuracy.md: no ranking without accuracy beside it
    for axis, r in result["axes"].items():
        sets = list(r["scores"])
        direction = "higher = better" if r["higher_is_better"] else "lower = more stable"
        what = "mean (rank)" if r["higher_is_better"] else "mean \\[95% CI] (rank)"
        with_accuracy = axis not in ACCURACY_QUANTITIES and any(
            (beside.get("scores") or {}).get(s) for s in sets)
        if with_accuracy:
            what += ", and beneath it the entry's accuracy \\[95% CI] on the same groups"
        t = Table(title=f"{esc(axis)} ({direction}): {what}", title_justify="left")
        t.add_column("")
        for s in sets:
            t.add_column(esc(s), justify="right")
        for lab in labels:
            cells = []
            for s in sets:
                sc = r["scores"][s].get(lab)
                if sc is None:
                    cells.append("-")
                    continue
                ci = f" \\[{fmt_num(sc['ci_low'])}, {fmt_num(sc['ci_high'])}]" if sc.get("ci_low") is not None else ""
                rank = r["ranks"][s][lab]
                acc = ((beside.get("scores") or {}).get(s) or {}).get(lab, {}).get(ACCURACY)
                below = f"\n{cell_text(acc, escape_brackets=True)}" if with_accuracy else ""
                cells.append(f"{fmt_num(sc['mean'])}{ci} ([bold]#{rank}[/bold]){below}")
            t.add_row(esc(lab), *cells)
        console.print(t)
        for check in beside.get("checks") or []:
            if check["axis"] == axis:
                console.print(f"  [red]less accurate[/red]: {esc(check['line'])}")
        if len(sets) >= 2 and len(labels) > 2:  # two entries: tau is +-1 by construction, the paired verdict says more
            tau = Table(title=f"{esc(axis)}: Kendall's tau between the sets' rankings", title_justify="left")
            tau.add_column("")
            for s in sets:
                tau.add_column(esc(s), justify="right")
            for s1 in sets:
                tau.add_row(esc(s1), *(fmt_num(r["tau"][s1].get(s2)) for s2 in sets))
            console.print(tau)
        tested = families.get(r.get("family", "axes"), {}).get("tested", 0)
        for f in r["flips"]:
            s1, s2 = f["sets"]
            o1, o2 = f["order"][s1], f["order"][s2]
            robust = {"robust": f" (robust: paired tests on both sets, Holm p={fmt_num(f.get('p_holm'))} over the "
                                f"{tested} flips that could occur)",
                      "not robust": " (not robust: the paired tests on both sets do not pass after the Holm correction; "
                                    "may be noise)",
                      NOT_ENOUGH_TO_TEST: f" ({NOT_ENOUGH_TO_TEST}: too few groups for paired tests to pass after the "
                                          "Holm correction)",
                      "untested": " (untested: no per-group records)"}[f.get("verdict", "untested")]
            console.print(f"  [yellow]rank flip[/yellow] on {esc(axis)}: {esc(o1[0])} beats {esc(o1[1])} on "
                          f"'{esc(s1)}', but {esc(o2[0])} beats {esc(o2[1])} on '{esc(s2)}'{robust}")
    if result.get("paired") is not None:
        print_paired(result["paired"], console)
    for note in [*result["notes"], *(beside.get("notes") or [])]:
        console.print(f"note: {esc(note)}")
    # docs/findings.md: the headline claims only robust flips, corrected over every flip that could occur.
    headline = reversal_headline(result)
    if len(result["sets"]) < 2:
        console.print("[bold]one shared set only[/bold]: no rank reversal can be checked.")
    elif not any(r["flips"] for r in result["axes"].values() if r.get("family", "axes") == "axes"):
        console.print("[bold]no rank reversal[/bold]: the sets order the entries the same way on every axis.")
    for i, line in enumerate(headline):
        console.print(f"[bold]{esc(line)}[/bold]" if i == 0 and not line.startswith("instability") else esc(line))


def print_paired(rows: list[dict[str, Any]], console: Any) -> None:
    """Two entries: the second against the first per set and quantity (stability axes, instability, accuracy),
    groups paired by id, by the verdict rule of report and the training log."""
    from rich.table import Table

    from ..formatting import fmt_p
    from .console import user_text as esc

    if not rows:
        return
    t = Table(title=f"paired: {esc(rows[0]['run'])} against {esc(rows[0]['reference'])}, per set and quantity "
                    "(groups paired by id; difference = second - first)", title_justify="left")
    for col in ("set", "quantity", "n", "difference \\[95% CI]", "p", "verdict"):
        t.add_column(col, justify="right" if col in ("n", "p") else "left")
    for r in rows:
        if not r.get("n"):
            t.add_row(esc(r["set"]), esc(r["axis"]), "0", "-", "-", esc(r["verdict"]))
            continue
        worse = r.get("outcome") == "worse"
        t.add_row(esc(r["set"]), esc(r["axis"]), str(r["n"]),
                  f"{fmt_num(r['mean_diff'])} \\[{fmt_num(r['ci_low'])}, {fmt_num(r['ci_high'])}]",
                  fmt_p(r["p_worse"] if worse else r["p_better"]), esc(r["verdict"]))
    console.print(t)


def run(args: argparse.Namespace) -> int:
    if len(args.dirs) < 2:
        raise SagoInputError(f"compare needs at least 2 directories, got {len(args.dirs)}")
    from ..analysis.compare import compare_evaluations, load_sources, parse_spec
    from ..results.layout import result_files
    from .console import make_console, user_text

    if args.json_out:  # before anything is read: never a directory, a link, or one of the results compared
        inputs = {label: path for d in args.dirs for label, path in result_files(parse_spec(d)[0]).items()}
        check_output_path(args.json_out, what="--json", inputs=inputs)
    evals = load_sources(args.dirs, last_only=True)
    result = compare_evaluations(evals, axes=args.axes,  # type: ignore[arg-type]
                                 allow_different_groups=args.allow_different_groups)
    if len(evals) == 2:  # the most common comparison (base vs fine-tune): the paired verdict per set and quantity
        from ..analysis.report import paired_against_first

        wanted = set(args.axes or []) | {"accuracy", "accuracy_all", "accuracy_worst_kind", "between_dispersion"}
        result["paired"] = [r for r in paired_against_first(evals) if not args.axes or r["axis"] in wanted]
    console = make_console()
    print_comparison(result, console)
    if args.json_out:
        atomic_write_json(args.json_out, result)
        console.print(f"wrote {user_text(args.json_out)}")
    return 0
