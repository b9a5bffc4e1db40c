"""Reference runs: execute the five notebooks in the full profile into ``reports/<gpu>/`` and
write ``summary.json``; render the README's headline table from it.

    python -m coursetools.report                  # on a CUDA machine (make report)
    python -m coursetools.report --readme-table reports/h200/summary.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

from coursetools import runner
from helpers import environment, machine
from helpers.results import atomic_write_text, slug

ROOT = Path(__file__).resolve().parent.parent
SUMMARY_KEYS = ("gpu_name", "driver", "torch", "cuda", "apex_commit", "course_commit", "date",
                "profile", "notebook_seconds", "transformer_paths", "optimizer_step", "norms")
PATH_KEYS = ("path", "label", "step_ms", "tokens_per_s", "mfu", "peak_mem_gib",
             "final_val_loss", "speedup_vs_fp32")
README_START = "<!-- headline:start -->"
README_END = "<!-- headline:end -->"


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200' (the vendor prefix dropped)."""
    return re.sub(r"^nvidia-", "", slug(name))


def _records(results: Path, name: str, columns: tuple[str, ...]) -> list[dict]:
    path = results / f"{name}.csv"
    if not path.exists():
        return []
    df = pd.read_csv(path)
    keep = [c for c in columns if c in df.columns]
    return json.loads(df[keep].to_json(orient="records"))


def build_summary(out: Path, runs: list[runner.NotebookRun], env: dict, profile: str) -> dict:
    """Collect the figures the README and later runs compare against."""
    results = out / "results"
    return {
        "gpu_name": env.get("gpu_name"),
        "driver": env.get("driver"),
        "torch": env.get("torch"),
        "cuda": env.get("torch_cuda"),
        "apex_commit": env.get("apex_commit"),
        "apex_extensions": env.get("apex_extensions"),
        "course_commit": env.get("course_commit"),
        "date": env.get("date"),
        "profile": profile,
        "notebook_seconds": {r.name: round(r.seconds, 1) for r in runs},
        "notebook_ok": {r.name: r.ok for r in runs},
        "transformer_paths": _records(results, "05_paths", PATH_KEYS),
        "optimizer_step": _records(results, "02_optimizer_step",
                                   ("candidate", "median_ms", "pct_of_copy_ceiling")),
        "norms": _records(results, "03_norm_timings",
                          ("norm", "candidate", "dtype", "pass", "median_ms",
                           "pct_of_copy_ceiling")),
    }


def validate_summary(summary: dict) -> list[str]:
    """Problems that make a summary unusable (empty list when well-formed)."""
    if not isinstance(summary, dict):
        return ["it holds no JSON object"]
    problems = [f"missing key '{k}'" for k in SUMMARY_KEYS if k not in summary]
    for index, row in enumerate(summary.get("transformer_paths", [])):
        problems += [f"transformer_paths[{index}] lacks '{k}'" for k in PATH_KEYS if k not in row]
    seconds = summary.get("notebook_seconds", {})
    if sorted(seconds) != sorted(p.name for p in runner.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        problems.append("notebook_seconds must name each of the five notebooks")
    return problems


def _fmt(value, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def readme_table(summary: dict) -> str:
    """The README's headline: notebook 05's paths on the reference GPU."""
    lines = [
        f"Measured on **{summary['gpu_name']}** (driver {summary['driver']}), torch "
        f"{summary['torch']} + CUDA {summary['cuda']}, Apex `{(summary['apex_commit'] or '?')[:8]}`"
        f", course commit `{summary['course_commit']}`, {summary['date'][:10]}.",
        "",
        "| path | step (ms) | tokens/s | MFU | peak mem (GiB) | val loss | speedup vs FP32 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary["transformer_paths"]:
        if row["step_ms"] is None:  # a path that was skipped on this machine
            continue
        lines.append(
            f"| {row['label']} | {_fmt(row['step_ms'], '.1f')}"
            f" | {_fmt(row['tokens_per_s'], ',.0f')}"
            f" | {_fmt(None if row['mfu'] is None else 100 * row['mfu'], '.1f')}%"
            f" | {_fmt(row['peak_mem_gib'], '.1f')} | {_fmt(row['final_val_loss'], '.3f')}"
            f" | {_fmt(row['speedup_vs_fp32'], '.2f')}x |")
    return "\n".join(lines)


def readme_section(readme: str) -> str | None:
    """The text between the headline markers, or None when the README has none."""
    match = re.search(re.escape(README_START) + r"\n(.*?)\n" + re.escape(README_END), readme, re.S)
    return match.group(1) if match else None


def main(argv: list[str] | None = None) -> int:
    """Run the reference report (or print the README table of an existing summary)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="default: reports/<gpu-slug>")
    parser.add_argument("--profile", default="full", choices=["full", "smoke"])
    parser.add_argument("--readme-table", type=Path, metavar="SUMMARY",
                        help="print the README headline table of SUMMARY and exit")
    args = parser.parse_args(argv)
    if args.readme_table:
        try:
            summary = json.loads(args.readme_table.read_text())
            problems = validate_summary(summary)
        except (OSError, ValueError) as exc:
            problems = [f"cannot read it ({type(exc).__name__}: {exc})"]
        if problems:
            print(f"report: error: {args.readme_table} is not a usable summary.json: "
                  f"{problems[0]}; run `make report` on a GPU machine to write one.",
                  file=sys.stderr)
            return 2
        print(readme_table(summary))
        return 0
    if args.profile == "full" and not machine.cuda_available():
        print("report: error: a reference report needs a CUDA GPU and torch sees none; "
              "run `make test` on this machine instead, or `make report` on a GPU machine.",
              file=sys.stderr)
        return 2
    env = environment.environment_report()
    out = args.out or ROOT / "reports" / gpu_slug(env.get("gpu_name") or "cpu")
    notebooks = sorted(runner.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    problem = runner.out_problem(out)
    if problem:
        print(f"report: error: {problem}", file=sys.stderr)
        return 2
    runs = runner.run_into(notebooks, out, profile=args.profile, keep_previous=False)
    summary = build_summary(out, runs, env, args.profile)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(runner.summary(runs))
    print(f"\nreport written to {out}; README table:\n\n{readme_table(summary)}")
    problems = validate_summary(summary)
    for problem in problems:
        print(f"report: summary problem: {problem}", file=sys.stderr)
    return 0 if all(r.ok for r in runs) and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
