"""The course's standard charts (helpers.charts): readable bar labels and axis ticks, error bars
from the IQR, grouped bars, reference lines and differences to a baseline."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers import charts  # noqa: E402


def test_value_label_uses_thousands_separators_from_1000_up():
    assert charts.value_label(527790.4) == "527,790"
    assert charts.value_label(1000) == "1,000"
    assert charts.value_label(2.071) == "2.07" and charts.value_label(0.000123) == "0.000123"


def test_bar_chart_labels_bars_and_ticks_in_plain_numbers():
    df = pd.DataFrame({"name": ["a", "b"], "tok": [75940.0, 675282.0]})
    ax = charts.bar_chart(df, "name", "tok", ylabel="tokens/s")
    ax.figure.canvas.draw()
    assert [t.get_text() for t in ax.texts] == ["75,940", "675,282"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and not any("e+" in t for t in ticks) and any("," in t for t in ticks)
    plt.close(ax.figure)


def test_bar_chart_error_bars_span_the_iqr():
    df = pd.DataFrame({"name": ["a", "b"], "ms": [2.0, 5.0], "q1": [1.5, 4.0], "q3": [3.0, 5.5]})
    ax = charts.bar_chart(df, "name", "ms", ylabel="ms", low="q1", high="q3")
    segments = ax.collections[0].get_segments()  # one vertical segment per bar
    assert [(s[0][1], s[1][1]) for s in segments] == [(1.5, 3.0), (4.0, 5.5)]
    plt.close(ax.figure)


def test_grouped_bars_put_each_hue_beside_the_others_and_leave_a_gap_where_absent():
    df = pd.DataFrame({"dtype": ["fp32", "fp32", "bf16"], "family": ["torch", "apex", "torch"],
                       "gbps": [10.0, 20.0, 30.0]})
    ax = charts.bar_chart(df, "dtype", "gbps", hue="family", ylabel="GB/s", annotate=False)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["torch", "apex"]
    torch_bars, apex_bars = ax.containers
    assert [b.get_height() for b in torch_bars] == [10.0, 30.0]
    assert apex_bars[0].get_height() == 20.0 and np.isnan(apex_bars[1].get_height())
    assert torch_bars[0].get_x() < apex_bars[0].get_x() < torch_bars[1].get_x()
    assert not ax.texts
    plt.close(ax.figure)


def test_line_chart_error_bars_ticks_at_the_data_and_a_reference_line():
    df = pd.DataFrame({"n": [4, 64, 1024] * 2, "ms": [1.0, 2.0, 8.0, 1.0, 1.5, 3.0],
                       "q1": [0.9, 1.8, 7.0, 0.9, 1.4, 2.9], "q3": [1.1, 2.2, 9.0, 1.1, 1.6, 3.1],
                       "who": ["a"] * 3 + ["b"] * 3})
    ax = charts.line_chart(df, "n", "ms", hue="who", low="q1", high="q3", logx=True,
                           ticks_at_data=True, xlabel="tensors", ylabel="step (ms)")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "64", "1,024"]
    bars = ax.collections[0].get_segments()
    assert [(s[0][1], s[1][1]) for s in bars] == [(0.9, 1.1), (1.8, 2.2), (7.0, 9.0)]
    charts.reference_line(ax, 0.5, "floor")
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"a", "b", "floor"}
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("tensors", "step (ms)")
    plt.close(ax.figure)


def test_difference_chart_draws_each_run_minus_the_baseline():
    df = pd.DataFrame({"step": [1, 2, 3] * 3, "loss": [3, 2, 1, 3.5, 2.0, 0.9, 3, 2, 1],
                       "run": ["base"] * 3 + ["a"] * 3 + ["b"] * 3})
    ax = charts.difference_chart(df, "step", "loss", hue="run", baseline="base",
                                 xlabel="step", ylabel="loss - base")
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()
             if not line.get_label().startswith("_")}
    assert lines["a"] == pytest.approx([0.5, 0.0, -0.1]) and lines["b"] == [0, 0, 0]
    assert "base" not in lines and ax.get_yscale() == "symlog"
    plt.close(ax.figure)
