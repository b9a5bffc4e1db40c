"""The course's chart helpers: readable bar labels and axis ticks."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers import results  # noqa: E402


def test_value_label_uses_thousands_separators_from_1000_up():
    assert results.value_label(527790.4) == "527,790"
    assert results.value_label(1000) == "1,000"
    assert results.value_label(2.071) == "2.07" and results.value_label(0.000123) == "0.000123"


def test_bar_chart_labels_bars_and_ticks_in_plain_numbers():
    df = pd.DataFrame({"name": ["a", "b"], "tok": [75940.0, 675282.0]})
    ax = results.bar_chart(df, "name", "tok", ylabel="tokens/s")
    ax.figure.canvas.draw()
    assert [t.get_text() for t in ax.texts] == ["75,940", "675,282"]
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and not any("e+" in t for t in ticks) and any("," in t for t in ticks)
    plt.close(ax.figure)


def test_difference_chart_draws_each_run_minus_the_baseline():
    df = pd.DataFrame({"step": [1, 2, 3] * 3, "loss": [3, 2, 1, 3.5, 2.0, 0.9, 3, 2, 1],
                       "run": ["base"] * 3 + ["a"] * 3 + ["b"] * 3})
    ax = results.difference_chart(df, "step", "loss", hue="run", baseline="base",
                                xlabel="step", ylabel="loss - base")
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()
             if not line.get_label().startswith("_")}
    assert lines["a"] == pytest.approx([0.5, 0.0, -0.1]) and lines["b"] == [0, 0, 0]
    assert "base" not in lines and ax.get_yscale() == "symlog"
    plt.close(ax.figure)
