"""Every course notebook executes headless in the smoke profile and produces its tables."""

from __future__ import annotations

import json
import subprocess
import types
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from conftest import NOTEBOOKS, SMOKE_BUDGET_S, _smoke_budget

from coursetools import runner
from helpers import verdicts

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_BUDGET_S = 90.0  # the slowest alone on CI's 2 cores: 24 to 39 s; catches a full size
EACH = [pytest.param(p, marks=pytest.mark.smoke(p.name[:2]), id=p.stem) for p in NOTEBOOKS]


def test_the_notebooks_are_numbered_in_order_from_01():
    numbers = [p.name[:2] for p in runner.course_notebooks()]
    assert numbers == [f"{i:02d}" for i in range(1, len(numbers) + 1)], numbers


@pytest.mark.notebook
@pytest.mark.parametrize("path", EACH)
def test_notebook_runs_and_saves_its_tables(smoke_run, path):
    out, runs = smoke_run
    run = runs[path.name]
    if not run.ok:  # a few lines: which cell (as a reader and ruff count them), and the way back
        name = f"notebooks/{path.name}"
        edited = subprocess.run(["git", "diff", "--quiet", "--", name], cwd=ROOT,
                                capture_output=True).returncode == 1
        pytest.fail(f"{path.name} failed in the smoke profile: {run.error}\nexecuted copy: "
                    f"{run.output}" + f"\n{name} differs from the committed notebook: see 'git "
                    f"diff -- {name}', or get it back with 'git checkout -- {name}'" * edited,
                    pytrace=False)
    executed = nbformat.read(out / path.name, as_version=4)
    assert not [o for c in executed.cells for o in c.get("outputs", []) if o.output_type == "error"]
    tables = sorted((out / "results").glob(f"{path.name[:2]}_*.csv"))
    assert tables, f"{path.name} saved no {path.name[:2]}_*.csv table in the smoke profile"
    assert run.seconds <= NOTEBOOK_BUDGET_S, (
        f"{path.name} took {run.seconds:.0f} s in the smoke profile, over "
        f"{NOTEBOOK_BUDGET_S:.0f} s")


@pytest.mark.notebook
@pytest.mark.smoke("05")
def test_05_reads_its_losses_against_the_yardsticks_it_measured(smoke_run):
    out, runs = smoke_run  # each loss read against twice the other seeds' spread
    runs["05_end_to_end_transformer.ipynb"]  # skips, saying so, where the run left 05 out
    saved = json.loads((out / "results" / "05_losses.json").read_text())
    noise = saved["noise"]
    assert len(noise["same_seed"]) == 2  # path 3 and the smoke profile's 1 repeat
    assert noise["floor"] == 0.0 < noise["seed_spread"]  # the CPU repeats a run exactly
    assert {"1", "3", "3 (repeat 1)", "3 (seed 1)"} <= set(saved["runs"])
    answers = pd.read_csv(out / "results" / "05_answers.csv")
    loss = answers[answers["measure"] == "final validation loss"]
    measured = loss[loss["verdict"] != verdicts.MISSING]  # paths 1 and 3 run on the CPU
    assert len(loss) == 3 and len(measured) == 1
    margin = verdicts.NOISE_FACTOR * 100 * noise["seed_spread"]
    assert measured["margin_pct"].iloc[0] == pytest.approx(margin)
    assert measured["verdict"].iloc[0] in (verdicts.SAME, "lower", "higher")


def test_the_smoke_notebooks_together_stay_within_their_budget(tmp_path):
    every = runner.course_notebooks()  # judged at the suite's end, once all of them ran
    config = types.SimpleNamespace(_course_smoke_seconds=tmp_path)
    for path in every[:-1]:
        (tmp_path / f"{path.name}.json").write_text(json.dumps(SMOKE_BUDGET_S / 2))
    assert _smoke_budget(config) is None  # one notebook has not run: no total yet
    (tmp_path / f"{every[-1].name}.json").write_text(json.dumps(1.0))
    total = SMOKE_BUDGET_S / 2 * (len(every) - 1) + 1
    said = _smoke_budget(config)
    assert said.startswith(f"the smoke notebooks took {total:.0f} s together, over SMOKE_BUDGET_S")
    for path in every:
        (tmp_path / f"{path.name}.json").write_text(json.dumps(SMOKE_BUDGET_S / len(every) / 2))
    assert _smoke_budget(config) is None


@pytest.mark.notebook
@pytest.mark.parametrize("path", EACH)
def test_notebook_saves_its_answers_by_the_one_rule(smoke_run, path):
    out, _ = smoke_run  # one verdict per row; verdicts live in the answers alone
    answers = out / "results" / f"{path.name[:2]}_answers.csv"
    assert answers.exists(), f"{path.name} saved no {answers.name}"
    df = pd.read_csv(answers, keep_default_na=False, na_values=[""])
    assert list(df.columns) == list(verdicts.ANSWER_COLUMNS)
    assert len(df) and (df.notebook.astype(str).str.zfill(2) == path.name[:2]).all()
    assert verdicts.check_answers(df) == []
    verdict_columns = {"verdict", "why", "fastest", "tied_with_fastest", "stable", "target",
                       "speeds_up", "reading"}
    for table in sorted((out / "results").glob(f"{path.name[:2]}_*.csv")):
        if table != answers:
            detail = pd.read_csv(table)
            assert not set(detail.columns) & verdict_columns, (table.name, set(detail.columns))
            labels = detail.get("label", pd.Series(dtype=str)).astype(str)  # names, not readings
            assert not labels.str.match(r"^(faster|slower) [\d.]+x$|^tie$").any(), table.name
