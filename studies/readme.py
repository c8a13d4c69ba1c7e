"""Each study's README carries a results table generated from its ``summary.json``, between two markers, so the
table cannot drift from the data: ``python -m studies.readme`` rewrites them, and a test checks they are current.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- table from summary.json: python -m studies.readme -->", "<!-- end of table -->"


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows of equal keys as a Markdown table."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def _interval(entry: Mapping[str, Any]) -> str:
    ci = entry["ci"]
    return f"{entry['mean']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def signed_interval(entry: Mapping[str, Any]) -> str:
    """A difference's mean and CI, signed: "+0.016 [-0.019, +0.052]"."""
    return f"{entry['mean']:+.3f} [{entry['ci'][0]:+.3f}, {entry['ci'][1]:+.3f}]"


def lag_frontier_table(summary: Mapping[str, Any]) -> str:
    arms = [{"arm": name, "J_auc [95 % CI]": _interval(arm["j_auc"]), "final J": f"{arm['j_final']['mean']:.3f}",
             "collapsed": arm["collapsed"]} for name, arm in summary["arms"].items()]
    j_auc = {(run["arm"], run["seed"]): run["j_auc"] for run in summary["runs"]}

    def paired_ci(c: Mapping[str, Any]) -> str:
        from grpo_lab.stats.intervals import mean_ci

        mean, half = mean_ci([j_auc[(c["a"], s)] - j_auc[(c["b"], s)] for s in c["seeds"]])
        return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"

    comparisons = [{"comparison": c["comparison"], "estimate [95 % CI]": paired_ci(c), "seeds": c["n"],
                    "Holm p (difference)": f"{c['holm_p_difference']:.2f}",
                    "Holm p (equivalence, ±m)": f"{c['holm_p_equivalence']:.2f}", "verdict": c["verdict"]}
                   for c in (*summary["comparisons"], *summary["mask_comparisons"])]
    return f"{markdown(arms)}\n\n{markdown(comparisons)}"


def time_to_accuracy_table(summary: Mapping[str, Any]) -> str:
    from studies.time_to_accuracy.summary import ratio_table

    return markdown([{k: v for k, v in row.items() if k != "seeds"} for row in ratio_table(summary)])


def lag_decided_table(summary: Mapping[str, Any]) -> str:
    from studies.lag_decided.design import COMPARISONS, lr_label

    rows = []
    for name, what in (("C1", "equivalence (±0.051) and difference"), ("C2", "difference")):
        c = summary["comparisons"].get(name)
        a, b = COMPARISONS[name]
        rows.append({"comparison": f"{name} `{a} − {b}`", "tests": what,
                     "verdict": c["verdict"] if c else "first look not due",
                     "estimate [repeated CI]": f"{c['estimate']:+.3f} [{c['rci'][0]:+.3f}, {c['rci'][1]:+.3f}]"
                     if c else "—", "seeds": (c["stopped_at_seeds"] or c["looks_reached"][-1]) if c
                     else summary["seeds_in"]})
    text = markdown(rows) + (f"\n\n{markdown(_arm_rows(summary['arms'], 'seeds of the last look'))}"
                             if summary["arms"] else "")
    sections = [(f"The field's corrections, lr {lr_label(summary['design']['lr'])}", summary["corrections"])]
    if summary["regime2"]["arms"]:   # its lr is chosen once its arms are in
        sections.insert(0, (f"Second regime, lr {lr_label(summary['regime2']['lr'])}", summary["regime2"]))
    for title, entry in sections:
        if entry["arms"]:
            differences = [{"difference (paired by seed)": f"`{name.replace(' - ', ' − ')}`",
                            "estimate [95 % t CI, unadjusted]": signed_interval(d)}
                           for name, d in entry["differences"].items()]
            text += (f"\n\n*{title} (exploratory, no test):*\n\n{markdown(_arm_rows(entry['arms'], 'seeds'))}"
                     f"\n\n{markdown(differences)}")
    return text


def _arm_rows(arms: Mapping[str, Any], seeds: str) -> list[dict[str, Any]]:
    return [{f"arm ({seeds})": f"`{name}` ({len(arm['seeds'])})",
             "J_auc [95 % CI]": _interval(arm["j_auc"]), "held-out J_auc": _interval(arm["held_out_j_auc"]),
             "final J": f"{arm['j_final']['mean']:.3f}", "collapsed": arm["collapsed"],
             "drift (nats a token)": f"{arm['drift']['mean']:.3g}",
             **({"tokens dropped (at the last lag)": _dropped(arm["dropped"])} if "dropped" in arm else {})}
            for name, arm in arms.items()]


def _dropped(entry: Mapping[str, Any]) -> str:
    return f"{entry['mean']:.1%} ({entry['at_last_lag']:.1%})"


TABLES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "lag_frontier": lag_frontier_table, "time_to_accuracy": time_to_accuracy_table,
    "lag_decided": lag_decided_table}
"""Study folder → its table from its summary."""


def summary_path(study: str) -> Path:
    folder = HERE / study
    return folder / "results" / "summary.json" if (folder / "results").is_dir() else folder / "summary.json"


def generated_readme(study: str) -> str:
    """The study's README with its table regenerated from its summary."""
    text = (HERE / study / "README.md").read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    table = TABLES[study](json.loads(summary_path(study).read_text()))
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> None:
    for study in TABLES:
        (HERE / study / "README.md").write_text(generated_readme(study))


if __name__ == "__main__":
    main()
