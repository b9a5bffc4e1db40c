"""The reference report (``make report``): a stamped folder reports/<gpu>/ of a full run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from coursetools import runner
from helpers import environment, machine

ROOT = Path(__file__).resolve().parent.parent
STAMP = ("gpu_name", "driver", "torch", "cuda", "apex_commit", "course_commit", "date", "profile")


def test_a_complete_report_replaces_the_folder_and_a_failed_one_stays_beside_it(
        tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("COURSE_RESULTS_DIR")
    monkeypatch.setattr(machine, "cuda_available", lambda: True)
    stamp = {"gpu_name": "NVIDIA H200", "driver": "580", "torch": "2.11.0",
             "apex_commit": "6424da3b", "course_commit": "abc123", "date": "2026-11-29"}
    monkeypatch.setattr(environment, "environment_report", lambda: stamp | {"torch_cuda": "13.0"})
    out = tmp_path / "reports" / "h200"
    (out / "results").mkdir(parents=True)
    (out / "summary.json").write_text('{"the": "good report"}')
    (nb := tmp_path / "01_a.ipynb").write_text("{}")
    outcome = {"error": "ValueError: planted"}

    def execute(path, out_dir, **kwargs):
        assert kwargs["profile"] == "full"
        (out_dir / path.name).write_text("executed")
        return runner.NotebookRun(path.name, 2.0, "FAILED" if outcome["error"] else "ok",
                                  out_dir / path.name, outcome["error"], peak_gpu_gib=4.567)

    monkeypatch.setattr(runner, "execute", execute)
    assert runner.main(["--report", "--out", str(out), str(nb)]) == 1
    assert json.loads((out / "summary.json").read_text()) == {"the": "good report"}
    beside = json.loads((tmp_path / "reports" / "h200-1" / "summary.json").read_text())
    assert beside["notebooks"]["01_a.ipynb"]["status"] == "FAILED"
    assert f"it is in {out}-1; {out} still holds the last complete run" in capsys.readouterr().out
    outcome["error"] = ""
    assert runner.main(["--report", "--out", str(out), str(nb)]) == 0
    assert out.is_dir() and not out.is_symlink() and sorted(p.name for p in out.parent.iterdir()
                                                           if p.name[0] != ".") == ["h200"]
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[k] for k in STAMP} == stamp | {"cuda": "13.0", "profile": "full"}
    assert summary["notebooks"]["01_a.ipynb"] == {"ok": True, "status": "ok", "seconds": 2.0,
                                                  "peak_gpu_gib": 4.57, "parameters": {},
                                                  "error": ""}


def test_committed_reports_are_stamped_full_runs_of_every_notebook():
    """No notebook failed; one cut short ("interrupted") only where the README says so."""
    from coursetools import headline

    readme = " ".join((ROOT / "README.md").read_text().split())
    chapters = [p.name for p in runner.course_notebooks()]
    for path in sorted((ROOT / "reports").glob("*/summary.json")):
        summary = json.loads(path.read_text())
        assert set(STAMP) <= set(summary) and summary["profile"] == "full", path
        ran = sorted(summary["notebooks"])  # an older run: the chapters of its day
        assert ran == (chapters if path.parent == headline.newest_run() else chapters[:len(ran)])
        for name, record in summary["notebooks"].items():
            assert record["status"] in ("ok", "interrupted"), f"{path}: {name}"
            if record["status"] == "interrupted":
                assert f"`{name[:-6]}` was interrupted" in readme, name


def test_readme_blocks_are_the_reference_runs():
    from coursetools import headline

    readme = (ROOT / "README.md").read_text()
    if headline.newest_run() is None:
        pytest.skip("no reference run committed")
    assert headline.with_blocks(readme, headline.readme_blocks(headline.newest_run())) \
        == readme, "run: python -m coursetools.headline --readme"


def test_the_readme_states_no_measured_figure_outside_its_generated_blocks():
    """Outside the generated blocks and code, the README quotes no measured figure."""
    readme = (ROOT / "README.md").read_text()
    prose = re.sub(r"<!-- (\w+):start -->.*?<!-- \1:end -->", "", readme, flags=re.S)
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)
    figures = re.findall(r"\d+(?:\.\d+)?\s?(?:ms|GiB|GB/s|TFLOP/s|x\b|%)", prose)
    assert figures == [], figures
