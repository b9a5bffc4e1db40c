"""Shared fixtures: every test writes results into its own temporary folder."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    monkeypatch.delenv("COURSE_HEADLESS", raising=False)
