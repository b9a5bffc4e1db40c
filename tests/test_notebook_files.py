"""Each course notebook is a readable notebook file: a broken one (cut short, not JSON) fails
here once, in the runner's one sentence with the fix; the tests that need it are skipped
(tests/conftest.py), and a run names it and goes on with the others."""

from __future__ import annotations

import pytest

from coursetools import runner


@pytest.mark.parametrize("path", runner.course_notebooks(), ids=lambda p: p.stem)
def test_the_notebook_file_is_a_notebook(path):
    problem = ""
    try:
        runner.read_notebook(path)
    except runner.UnreadableNotebook as exc:
        problem = str(exc)
    if problem:
        pytest.fail(problem, pytrace=False)
