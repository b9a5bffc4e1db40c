"""Reference runs: execute the notebooks in the full profile into ``reports/<gpu>/`` and
write ``summary.json``; render the README's headline table from it.

    python -m coursetools.report                  # on a CUDA machine (make report)
    python -m coursetools.report notebooks/06_*.ipynb   # re-run some; the others are kept
    python -m coursetools.report --out reports/h200-fp16 --param amp_dtype=fp16
    python -m coursetools.report --readme-table reports/h200/summary.json

A whole run that fails or is interrupted is written to ``<out>.incomplete`` (with its
``summary.json``) and leaves the report in ``<out>`` as it was (``runner.run_into``).
Naming notebooks re-runs only those into an existing report: they run beside a copy of the
report's results (so notebook 07 reads 05's table), their executed copies and their ``NN_*``
results replace the old ones (unless a re-run failed where the report holds a good earlier run,
which then stays), and ``summary.json`` records each notebook's own course commit,
time and GPU memory (``notebooks``), so a report never mixes runs without saying so.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import pandas as pd

from coursetools import runner
from helpers import environment, machine
from helpers.results import atomic_write_text, slug, staging_dir

ROOT = Path(__file__).resolve().parent.parent
SUMMARY_KEYS = ("gpu_name", "driver", "torch", "cuda", "apex_commit", "course_commit", "date",
                "profile", "notebook_seconds", "transformer_paths", "tables")
PATH_KEYS = ("path", "label", "step_ms", "tokens_per_s", "mfu", "peak_mem_gib",
             "final_val_loss", "speedup_vs_fp32")
README_START = "<!-- headline:start -->"
README_END = "<!-- headline:end -->"


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200' (the vendor prefix dropped)."""
    return re.sub(r"^nvidia-", "", slug(name))


def _records(results: Path, name: str, columns: tuple[str, ...] | None = None) -> list[dict]:
    path = results / f"{name}.csv"
    if not path.exists():
        return []
    df = pd.read_csv(path)
    keep = [c for c in columns if c in df.columns] if columns else list(df.columns)
    return json.loads(df[keep].to_json(orient="records"))


def result_tables(results: Path) -> dict[str, list[dict]]:
    """Every table a notebook saved (``NN_<name>.csv`` in ``results``: a notebook's tables carry
    its number), as records by table name: a new chapter's tables come in with no list to edit."""
    numbers = {p.name[:2] for p in runner.course_notebooks()}
    return {p.stem: _records(results, p.stem) for p in sorted(results.glob("[0-9][0-9]_*.csv"))
            if p.name[:2] in numbers}


def notebook_records(runs: list[runner.NotebookRun], env: dict) -> dict:
    """One record per notebook run: its status, time, GPU memory, parameters and commit."""
    return {r.name: {"ok": r.ok, "status": r.status, "seconds": round(r.seconds, 1),
                     "peak_gpu_gib": None if r.peak_gpu_gib is None else round(r.peak_gpu_gib, 2),
                     "parameters": r.parameters or {}, "course_commit": env.get("course_commit"),
                     "apex_commit": env.get("apex_commit"), "date": env.get("date")}
            for r in runs}


def build_summary(out: Path, runs: list[runner.NotebookRun], env: dict, profile: str,
                  previous: dict | None = None, parameters: dict | None = None) -> dict:
    """Collect the figures the README and later runs compare against. With ``previous`` (the
    summary of the report these runs were merged into), the notebooks not run now keep their
    records, and the report's Apex stays the one it was built with when these runs had none
    (06 and 07 do not import Apex: a re-run of them on a machine without it must not erase it);
    each notebook's record names the Apex it ran with."""
    results = out / "results"
    previous = previous or {}
    notebooks = dict(previous.get("notebooks", {}))
    notebooks.update(notebook_records(runs, env))
    notebooks = dict(sorted(notebooks.items()))
    return {
        "gpu_name": env.get("gpu_name"),
        "driver": env.get("driver"),
        "torch": env.get("torch"),
        "cuda": env.get("torch_cuda"),
        "apex_commit": env.get("apex_commit") or previous.get("apex_commit"),
        "apex_extensions": (env.get("apex_extensions") if env.get("apex_commit")
                            else previous.get("apex_extensions")),
        "course_commit": env.get("course_commit"),
        "date": env.get("date"),
        "profile": profile,
        "parameters": parameters or {},
        "notebook_seconds": {k: v["seconds"] for k, v in notebooks.items()},
        "notebook_ok": {k: v["ok"] for k, v in notebooks.items()},
        "notebooks": notebooks,
        # the README's headline is notebook 05's table of paths (readme_table)
        "transformer_paths": _records(results, "05_paths", PATH_KEYS),
        "tables": result_tables(results),
    }


def merge_into(out: Path, staging: Path, names: list[str]) -> None:
    """Move the executed notebooks ``names`` and their ``NN_*`` results from ``staging`` into
    the report ``out``, replacing the old ones; the rest of ``out`` stays."""
    (out / "results").mkdir(parents=True, exist_ok=True)
    runner.repoint_outputs(staging, out)  # printed paths name the report, not the staging
    for name in names:
        prefix = name[:3]  # "06_"
        for old in (out / "results").glob(prefix + "*"):
            old.unlink()
        for new in (staging / "results").glob(prefix + "*"):
            shutil.move(str(new), out / "results" / new.name)
        if (staging / name).exists():
            shutil.move(str(staging / name), out / name)
    for cache in (staging / "results").glob("ceilings-*.json"):  # the newest measured ceilings
        shutil.move(str(cache), out / "results" / cache.name)
    shutil.rmtree(staging, ignore_errors=True)


def validate_summary(summary: dict) -> list[str]:
    """Problems that make a summary unusable (empty list when well-formed)."""
    if not isinstance(summary, dict):
        return ["it holds no JSON object"]
    problems = [f"missing key '{k}'" for k in SUMMARY_KEYS if k not in summary]
    paths, seconds = summary.get("transformer_paths", []), summary.get("notebook_seconds", {})
    if not isinstance(paths, list) or not all(isinstance(row, dict) for row in paths):
        return problems + ["transformer_paths must be a list of rows (JSON objects)"]
    if not isinstance(seconds, dict):
        return problems + ["notebook_seconds must map each notebook to its seconds"]
    for index, row in enumerate(paths):
        problems += [f"transformer_paths[{index}] lacks '{k}'" for k in PATH_KEYS if k not in row]
        problems += [f"transformer_paths[{index}]['{k}'] is not a number" for k in PATH_KEYS[3:]
                     if not isinstance(row.get(k), int | float | None)]
    wanted = [p.name for p in runner.course_notebooks()]
    if sorted(seconds) != wanted:
        lacking = sorted(set(wanted) - set(seconds)) or sorted(set(seconds) - set(wanted))
        problems.append("notebook_seconds must name each notebook of notebooks/ and no other "
                        f"(not so: {', '.join(lacking)})")
    return problems


def _fmt(value, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def readme_table(summary: dict) -> str:
    """The README's headline: notebook 05's paths on the reference GPU."""
    ran = summary.get("notebooks", {}).get("05_end_to_end_transformer.ipynb", {})  # its own run
    commit = ran.get("course_commit", summary["course_commit"])
    apex = ran.get("apex_commit", summary["apex_commit"])
    date = ran.get("date", summary["date"])
    lines = [
        f"Measured on **{summary['gpu_name']}** (driver {summary['driver']}), torch "
        f"{summary['torch']} + CUDA {summary['cuda']}, Apex `{(apex or '?')[:8]}`"
        f", course commit `{commit}`, {date[:10]}.",
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
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="re-run only these into the existing report (default: all)")
    parser.add_argument("--out", type=Path, help="default: reports/<gpu-slug>")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="set a parameter in every notebook that defines it (papermill)")
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
    every = runner.course_notebooks()
    notebooks = [p.resolve() for p in args.notebooks] or every
    previous = None
    if args.notebooks:
        try:
            previous = json.loads((out / "summary.json").read_text())
        except (OSError, ValueError):
            print(f"report: error: re-running some notebooks needs the report they join, and "
                  f"{out / 'summary.json'} is missing or unreadable: run `make report` first.",
                  file=sys.stderr)
            return 2
    problem = (next((f"no such notebook: {p}" for p in notebooks if not p.exists()), "")
               or runner.out_problem(out) or runner.params_problem(notebooks, args.param))
    if problem:
        print(f"report: error: {problem}", file=sys.stderr)
        return 2
    params = runner.parse_params(args.param)
    kept = []  # re-runs that failed where the report holds a good earlier run: that one stays
    written = out  # where this run's report is: <out>.incomplete for an incomplete whole run
    if previous is None:
        runs = runner.run_into(notebooks, out, profile=args.profile, keep_previous=False,
                               params=params)
        if not runner.is_complete(runs, notebooks):  # the report in out stays the complete one
            written = runner.incomplete_dir(out)
            print(f"report: {runner.where_line(out, runs, notebooks)}", file=sys.stderr)
    else:
        staging = staging_dir(out)  # merged into the report below, not swapped in
        if (out / "results").is_dir():  # the other notebooks' tables, for the ones re-run to read
            shutil.copytree(out / "results", staging / "results")
        runs = []
        try:
            runs = runner.run_all(notebooks, staging, profile=args.profile, params=params)
        finally:
            kept = [r for r in runs if not r.ok and (out / r.name).exists()
                    and previous.get("notebooks", {}).get(r.name, {}).get("ok")]
            merge_into(out, staging, [r.name for r in runs if r not in kept])
        for run in kept:
            print(f"report: {run.name} {run.status} in this re-run ({run.error or 'see above'}); "
                  "the report keeps its earlier run of it", file=sys.stderr)
    recorded = [r for r in runs if r not in kept]
    summary = build_summary(written, recorded, env, args.profile, previous, params)
    atomic_write_text(written / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(runner.summary(runs))
    print(f"\nreport written to {written}; README table:\n\n{readme_table(summary)}")
    problems = validate_summary(summary)
    for problem in problems:
        print(f"report: summary problem: {problem}", file=sys.stderr)
    return 0 if all(r.ok for r in runs) and not problems else 1

if __name__ == "__main__":
    sys.exit(main())
