"""coursetools.agree: two runs' verdicts compared cell by cell, figures set aside."""

from __future__ import annotations

import pandas as pd

from coursetools import agree


def _report(root, tables: dict[str, pd.DataFrame]):
    (root / "results").mkdir(parents=True)
    for name, df in tables.items():
        df.to_csv(root / "results" / f"{name}.csv", index=False)
    return root


def test_the_same_verdict_with_other_figures_agrees_and_another_word_does_not(tmp_path):
    a = _report(tmp_path / "a", {"02_pairs": pd.DataFrame(
        {"candidate": ["fused", "foreach"], "median_ms": [1.0, 2.0],
         "label": ["faster 1.40x", "tie"], "stable": [True, True]})})
    b = _report(tmp_path / "b", {"02_pairs": pd.DataFrame(
        {"candidate": ["fused", "foreach"], "median_ms": [1.1, 2.1],
         "label": ["faster 1.38x", "slower 0.90x"], "stable": [True, False]})})
    cells, skipped = agree.compare(a, b)
    assert not skipped and len(cells) == 4  # median_ms is a figure, not a verdict
    differ = [(c.row, c.column) for c in cells if not c.same_verdict]
    assert differ == [("foreach", "label"), ("foreach", "stable")]
    table = agree.summary(cells).iloc[0]
    assert (table.compared, table.identical, table.same_verdict, table.differ) == (4, 1, 2, 2)
    assert agree.main([str(a), str(b)]) == 1
    assert agree.main([str(a), str(a)]) == 0


def test_a_crossover_width_is_compared_as_written(tmp_path):
    a, b = (_report(tmp_path / k, {"06_crossover": pd.DataFrame({"recipe": ["t"],
                                                                  "crossover": [w]})})
            for k, w in (("a", 2048), ("b", 4096)))
    (cell,), _ = agree.compare(a, b)
    assert not cell.same_verdict


def test_tables_of_different_lengths_and_empty_folders_are_named(tmp_path, capsys):
    a = _report(tmp_path / "a", {"t": pd.DataFrame({"verdict": ["tie", "tie"]})})
    b = _report(tmp_path / "b", {"t": pd.DataFrame({"verdict": ["tie"]})})
    assert agree.compare(a, b)[1] == ["t.csv: 2 rows in one run, 1 in the other"]
    (tmp_path / "empty").mkdir()
    assert agree.main([str(a), str(tmp_path / "empty")]) == 2
    assert "holds no results/*.csv" in capsys.readouterr().err
