"""The reference report: summary.json stays well-formed and the README headline matches it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from coursetools import report, runner

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_NAMES = [p.name for p in runner.course_notebooks()]


def _fake_run(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    results.mkdir(parents=True)
    pd.DataFrame([
        {"path": "1", "label": "FP32 vanilla", "step_ms": 200.0, "tokens_per_s": 8e4,
         "mfu": 0.04, "peak_mem_gib": 10.0, "final_val_loss": 2.80, "speedup_vs_fp32": 1.0},
        {"path": "3", "label": "Native fused + torch.amp", "step_ms": 40.0, "tokens_per_s": 4e5,
         "mfu": 0.22, "peak_mem_gib": 6.5, "final_val_loss": 2.81, "speedup_vs_fp32": 5.0},
    ]).to_csv(results / "05_paths.csv", index=False)
    pd.DataFrame([{"candidate": "fused", "median_ms": 2.0, "pct_of_copy_ceiling": 82.0,
                   "ignored": 1}]).to_csv(results / "02_optimizer_step.csv", index=False)
    pd.DataFrame([{"x": 1}]).to_csv(results / "99_not_a_notebook.csv", index=False)
    pd.DataFrame([{"x": 1}]).to_csv(results / "scratch.csv", index=False)
    return tmp_path


def _env() -> dict:
    return {"gpu_name": "NVIDIA H200", "driver": "580", "torch": "2.11.0", "torch_cuda": "13.0",
            "apex_commit": "6424da3b4faa6c8f", "course_commit": "abc123",
            "date": "2026-11-29T00:00:00+00:00"}


def test_gpu_slug_drops_the_vendor():
    assert report.gpu_slug("NVIDIA H200") == "h200"
    assert report.gpu_slug("Tesla T4") == "tesla-t4"


def test_summary_collects_the_figures(tmp_path):
    out = _fake_run(tmp_path)
    runs = [runner.NotebookRun(name, 10.0, True, out / name) for name in NOTEBOOK_NAMES]
    summary = report.build_summary(out, runs, _env(), "full")
    assert report.validate_summary(summary) == []
    assert summary["transformer_paths"][1]["speedup_vs_fp32"] == 5.0
    # every NN_*.csv of a course notebook comes in whole, by its name; others do not
    assert summary["tables"]["02_optimizer_step"] == [{"candidate": "fused", "median_ms": 2.0,
                                                       "pct_of_copy_ceiling": 82.0, "ignored": 1}]
    assert sorted(summary["tables"]) == ["02_optimizer_step", "05_paths"]
    table = report.readme_table(summary)
    assert "| Native fused + torch.amp | 40.0 | 400,000 | 22.0% | 6.5 | 2.810 | 5.00x |" in table
    summary["transformer_paths"][0].pop("mfu")
    summary.pop("driver")
    problems = report.validate_summary(summary)
    assert "missing key 'driver'" in problems and "transformer_paths[0] lacks 'mfu'" in problems


def test_report_refuses_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(report.machine, "cuda_available", lambda: False)
    assert report.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_committed_summaries_are_well_formed():
    for path in sorted((ROOT / "reports").glob("*/summary.json")):
        summary = json.loads(path.read_text())
        problems = report.validate_summary(summary)
        assert problems == [], f"{path}: {problems}"
        # a committed reference run is a full-profile run in which no notebook failed; one cut
        # short by the time limit of its run ("interrupted") is allowed only where the README
        # names it and says what did not run
        assert summary["profile"] == "full", path
        readme = " ".join((ROOT / "README.md").read_text().split())
        for name, record in summary.get("notebooks", {}).items():
            status = record.get("status", "ok" if record["ok"] else "FAILED")
            assert status in ("ok", "interrupted"), f"{path}: {name} {status}"
            if status == "interrupted":
                assert f"`{name[:-6]}` was interrupted" in readme, name
        if "notebooks" not in summary:
            assert summary["notebook_ok"] and all(summary["notebook_ok"].values()), path


def test_readme_blocks_are_the_reference_runs():
    """The README's answers and notebook tables are generated from reports/h200
    (`python -m coursetools.headline --readme`): a new reference run, or a hand edit, that
    leaves them behind fails here."""
    from coursetools import headline

    readme = (ROOT / "README.md").read_text()
    if not (ROOT / "reports" / "h200" / "summary.json").exists():
        pytest.skip("no reference run committed")
    assert headline.with_blocks(readme, headline.readme_blocks(ROOT / "reports" / "h200")) \
        == readme, "run: python -m coursetools.headline --readme"


def test_the_readme_states_no_measured_figure_outside_its_generated_blocks():
    """A figure of a run is data: outside the generated blocks (and code), the README quotes
    no measured time, memory, ratio or share, so none can go stale."""
    readme = (ROOT / "README.md").read_text()
    prose = re.sub(r"<!-- (\w+):start -->.*?<!-- \1:end -->", "", readme, flags=re.S)
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)
    figures = re.findall(r"\d+(?:\.\d+)?\s?(?:ms|GiB|GB/s|TFLOP/s|x\b|%)", prose)
    assert figures == [], figures


def test_rerunning_some_notebooks_keeps_the_others_and_says_which_commit_ran_which(tmp_path):
    """A report re-run for one notebook: its copy and NN_* results replace the old ones, the
    other notebooks' files and records stay, and each record names its own commit."""
    out = _fake_run(tmp_path / "report")
    first = [runner.NotebookRun(name, 10.0, True, out / name) for name in NOTEBOOK_NAMES]
    previous = report.build_summary(out, first, _env(), "full")
    (out / NOTEBOOK_NAMES[0]).write_text("old 01")
    (out / NOTEBOOK_NAMES[1]).write_text("old 02")
    (out / "results" / "02_optimizer_step.png").write_text("old plot")
    staging = tmp_path / "staging"
    (staging / "results").mkdir(parents=True)
    (staging / NOTEBOOK_NAMES[1]).write_text("new 02")
    pd.DataFrame([{"candidate": "fused", "median_ms": 1.5, "pct_of_copy_ceiling": 90.0}]).to_csv(
        staging / "results" / "02_optimizer_step.csv", index=False)
    report.merge_into(out, staging, [NOTEBOOK_NAMES[1]])
    assert (out / NOTEBOOK_NAMES[0]).read_text() == "old 01"
    assert (out / NOTEBOOK_NAMES[1]).read_text() == "new 02"
    assert not (out / "results" / "02_optimizer_step.png").exists()  # the old run's plot goes
    assert (out / "results" / "05_paths.csv").exists() and not staging.exists()
    rerun = [runner.NotebookRun(NOTEBOOK_NAMES[1], 3.0, True, out / NOTEBOOK_NAMES[1],
                                peak_gpu_gib=1.234)]
    env = dict(_env(), course_commit="def456")
    summary = report.build_summary(out, rerun, env, "full", previous)
    assert report.validate_summary(summary) == []
    records = summary["notebooks"]
    assert records[NOTEBOOK_NAMES[0]]["course_commit"] == "abc123"
    assert records[NOTEBOOK_NAMES[1]] == {"ok": True, "status": "ok", "seconds": 3.0,
                                          "peak_gpu_gib": 1.23,
                                          "parameters": {}, "course_commit": "def456",
                                          "apex_commit": env["apex_commit"],
                                          "date": env["date"]}
    assert summary["tables"]["02_optimizer_step"][0]["median_ms"] == 1.5
    assert summary["notebook_seconds"][NOTEBOOK_NAMES[0]] == 10.0


def test_rerunning_some_notebooks_needs_the_report_they_join(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(report.machine, "cuda_available", lambda: True)
    monkeypatch.setattr(report.environment, "environment_report", _env)
    code = report.main([str(runner.NOTEBOOKS / NOTEBOOK_NAMES[0]), "--out", str(tmp_path / "x")])
    assert code == 2
    assert "needs the report they join" in capsys.readouterr().err


def test_a_rerun_without_apex_keeps_the_reports_apex_and_says_it_had_none(tmp_path):
    """Notebooks 06 and 07 re-run on a machine where Apex is not installed: the report keeps the
    Apex its other notebooks ran with, the re-run records say they had none, and the headline
    names the Apex of notebook 05's own run."""
    out = _fake_run(tmp_path)
    first = [runner.NotebookRun(name, 10.0, True, out / name) for name in NOTEBOOK_NAMES]
    previous = report.build_summary(out, first, dict(_env(), apex_extensions={"amp_C": True}),
                                    "full")
    rerun = [runner.NotebookRun(NOTEBOOK_NAMES[-1], 3.0, True, out / NOTEBOOK_NAMES[-1])]
    bare = dict(_env(), apex_commit=None, apex_extensions={}, course_commit="def456")
    summary = report.build_summary(out, rerun, bare, "full", previous)
    assert summary["apex_commit"] == _env()["apex_commit"]
    assert summary["apex_extensions"] == {"amp_C": True}
    assert summary["notebooks"][NOTEBOOK_NAMES[-1]]["apex_commit"] is None
    assert summary["notebooks"][NOTEBOOK_NAMES[0]]["apex_commit"] == _env()["apex_commit"]
    assert f"Apex `{_env()['apex_commit'][:8]}`" in report.readme_table(summary)
    with_apex = dict(_env(), apex_commit="0123456789ab", apex_extensions={"amp_C": False})
    summary = report.build_summary(out, rerun, with_apex, "full", previous)
    assert summary["apex_commit"] == "0123456789ab"  # a re-run that had Apex names its own
    assert summary["apex_extensions"] == {"amp_C": False}


@pytest.mark.parametrize("broken", [{"transformer_paths": None}, {"notebook_seconds": 5},
                                    {"transformer_paths": [1]},
                                    {"transformer_paths": [{"step_ms": "fast"}]}])
def test_a_malformed_summary_is_one_sentence(tmp_path, capsys, broken):
    good = report.build_summary(_fake_run(tmp_path), [], _env(), "full")
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({**good, **broken}))
    assert report.main(["--readme-table", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"report: error: {path} is not a usable summary.json")
    assert "Traceback" not in captured.err and captured.out == ""


def test_a_missing_notebook_is_named_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(report.machine, "cuda_available", lambda: True)
    monkeypatch.setattr(report.environment, "environment_report", _env)
    out = _fake_run(tmp_path / "report")
    (out / "summary.json").write_text("{}")
    code = report.main([str(runner.NOTEBOOKS / "06_typo.ipynb"), "--out", str(out)])
    assert code == 2
    assert "no such notebook:" in capsys.readouterr().err


def test_a_failed_rerun_keeps_the_reports_good_earlier_run(tmp_path, monkeypatch, capsys):
    """Re-running 02 fails: the report keeps its earlier, good copy, results and record, says so
    in one line, and the command exits 1."""
    monkeypatch.setattr(report.machine, "cuda_available", lambda: True)
    monkeypatch.setattr(report.environment, "environment_report", _env)
    out = _fake_run(tmp_path / "report")
    first = [runner.NotebookRun(name, 10.0, True, out / name) for name in NOTEBOOK_NAMES]
    (out / "summary.json").write_text(json.dumps(report.build_summary(out, first, _env(), "full")))
    name = NOTEBOOK_NAMES[1]
    (out / name).write_text("good 02")

    def failing_run_all(paths, staging, **_kw):
        (staging / name).write_text("failed 02")
        (staging / "results" / "02_optimizer_step.csv").write_text("candidate\n")
        return [runner.NotebookRun(name, 1.0, False, staging / name, error="boom")]

    monkeypatch.setattr(report.runner, "run_all", failing_run_all)
    assert report.main([str(runner.NOTEBOOKS / name), "--out", str(out)]) == 1
    assert (out / name).read_text() == "good 02"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["notebooks"][name]["ok"]
    assert summary["tables"]["02_optimizer_step"][0]["median_ms"] == 2.0
    assert f"report: {name} FAILED in this re-run (boom); the report keeps its earlier run" in (
        capsys.readouterr().err)
    assert not (tmp_path / "report.partial").exists()


def test_a_failed_whole_run_leaves_the_report_and_is_written_beside_it(tmp_path, monkeypatch,
                                                                        capsys):
    """A whole report run that fails goes, with its summary.json, to <out>.incomplete; the
    report in <out> (its notebooks, results and summary) stays as it was."""
    monkeypatch.setattr(report.machine, "cuda_available", lambda: True)
    monkeypatch.setattr(report.environment, "environment_report", _env)
    out = _fake_run(tmp_path / "report")
    (out / "summary.json").write_text('{"the": "good report"}')

    def failing_run_all(paths, staging, **_kw):
        (staging / "results").mkdir(parents=True)
        (staging / paths[0].name).write_text("failed 01")
        return [runner.NotebookRun(paths[0].name, 1.0, False, staging / paths[0].name,
                                   error="boom")]

    monkeypatch.setattr(report.runner, "run_all", failing_run_all)
    assert report.main(["--out", str(out)]) == 1
    assert json.loads((out / "summary.json").read_text()) == {"the": "good report"}
    assert (out / "results" / "05_paths.csv").exists()
    incomplete = tmp_path / "report.incomplete"
    summary = json.loads((incomplete / "summary.json").read_text())
    assert summary["notebook_ok"] == {NOTEBOOK_NAMES[0]: False}
    captured = capsys.readouterr()
    unrun = f"{len(NOTEBOOK_NAMES) - 1} of {len(NOTEBOOK_NAMES)} not run"
    assert (f"report: this run is incomplete ({NOTEBOOK_NAMES[0]} FAILED, {unrun}): it "
            f"is in {incomplete}; {out} still holds the last complete run") in captured.err
    assert f"report written to {incomplete};" in captured.out
    assert not (tmp_path / "report.partial").exists()
