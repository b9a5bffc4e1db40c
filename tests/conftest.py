"""Shared fixtures, and how the suite spreads over the CPU cores.

* Every test writes results into its own temporary folder.
* ``smoke_run``: the course's notebooks executed once, in order, in the smoke profile (as
  ``make run`` does on a CPU machine), shared by every test that reads an executed notebook or
  its tables. Notebook 06 runs with ``emulate_fp8=True`` (``SMOKE_PARAMS``), so its sections 3-4
  (float8 training through torchao's emulation) execute on the CPU too.
* With pytest-xdist installed, ``pytest`` without ``-n`` runs one worker per core (at most
  ``MAX_WORKERS``) with ``--dist loadgroup``. Tests that share an expensive
  fixture (``smoke_run``, or a module-scoped fixture of their file) are put in one xdist group,
  so that fixture runs once, on one worker; the longest work is handed out first (by each test's
  seconds in the last run, kept in pytest's cache; without them the smoke group, then tests
  marked ``slow`` or ``notebook``), and each worker's torch gets its share of the cores
  (OMP_NUM_THREADS, at least one thread).
  ``-n 0`` (or ``-p no:xdist``) runs everything in one process, in file order.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _selected_notebooks() -> list[Path]:
    """The course's notebooks (found in notebooks/), or those $COURSE_TEST_NOTEBOOKS names."""
    from coursetools.runner import course_notebooks
    from helpers.settings import TEST_NOTEBOOKS_VAR

    every = course_notebooks()
    wanted = {n.strip() for n in os.environ.get(TEST_NOTEBOOKS_VAR, "").split(",") if n.strip()}
    return [p for p in every if p.name[:2] in wanted] if wanted else every


NOTEBOOKS = _selected_notebooks()  # what the smoke run executes, and test_notebooks.py checks
# set where a notebook defines the name (runner --param): 06 runs its float8 sections emulated
SMOKE_PARAMS = {"emulate_fp8": True}
SMOKE_GROUP = "smoke-notebooks"
MAX_WORKERS = 4  # more would not finish sooner: the smoke group runs on one worker


def pytest_collection_finish(session):
    """The objects alive once the tests are collected (torch, pandas, the test modules) are never
    garbage: frozen, so that each full pass of the garbage collector during the run skips them
    (the in-process tests of test_gpt, test_core_helpers, test_end_to_end, test_norms and
    test_optimizers, in one process on two CPUs: 17.8 and 19.3 s frozen, 21.0 and 23.4 s not)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    monkeypatch.delenv("COURSE_HEADLESS", raising=False)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """(out, {notebook name: NotebookRun}): every notebook executed once in the smoke profile
    into ``out`` (executed copies in ``out``, tables in ``out/results``)."""
    from coursetools import runner

    out = tmp_path_factory.mktemp("smoke")
    saved = dict(os.environ)  # the runner sets the kernels' variables in this process
    try:
        runs = runner.run_all(NOTEBOOKS, out, profile="smoke", timeout=300,
                              notebook_timeout=120, params=SMOKE_PARAMS)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    print("\n" + runner.summary(runs))
    return out, SmokeRuns({r.name: r for r in runs})


class SmokeRuns(dict):
    """The smoke run's notebooks by name; a test asking for one this run left out (a smaller
    $COURSE_TEST_NOTEBOOKS) is skipped, saying so."""

    def __missing__(self, name: str):
        from helpers.settings import TEST_NOTEBOOKS_VAR

        if not os.environ.get(TEST_NOTEBOOKS_VAR):  # every notebook ran: a missing one is a bug
            raise KeyError(name)
        pytest.skip(f"{name} is not in this smoke run (${TEST_NOTEBOOKS_VAR})")


# ------------------------------------------------------------------ running on every core
# xdist's own loadgroup puts the group in the test's node id, which pytest 9.2 no longer lets a
# plugin change (pytest-xdist issue #1386): each worker writes its units to a file instead, and
# the scheduler below reads them.
UNITS_DIR = "course_units_dir"  # workerinput key: where the workers write their units


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """-n <cores, at most MAX_WORKERS> --dist loadgroup, when pytest-xdist is here and neither
    -n nor --pdb was given."""
    option = config.option
    if (not config.pluginmanager.hasplugin("xdist") or option.numprocesses is not None
            or config.getoption("usepdb", False) or os.environ.get("PYTEST_XDIST_WORKER")):
        return
    option.numprocesses = max(1, min(MAX_WORKERS, _cores()))
    if option.dist == "no":
        option.dist = "loadgroup"
    option.loadscopereorder = False  # the workers' order: the longest work first


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def pytest_configure(config):
    """On a worker: torch and its children (kernels, torchrun's ranks) use this worker's share
    of the cores, so two workers on two cores do not each spin two threads (OMP_NUM_THREADS,
    unless it is set already)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        share = max(1, _cores() // int(workerinput.get("workercount", 1)))
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    if node.config.option.dist == "loadgroup":
        if not hasattr(node.config, "_course_units"):
            node.config._course_units = Path(tempfile.mkdtemp(prefix="course-test-units-"))
        node.workerinput[UNITS_DIR] = str(node.config._course_units)


DURATIONS_KEY = "course/test-seconds"  # pytest's cache: each test's seconds in the last run


_seconds: dict[str, float] = {}  # this run's tests, as the controller (or one process) sees them


def pytest_runtest_logreport(report):
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration  # all 3 phases


def pytest_sessionfinish(session):
    cache = getattr(session.config, "cache", None)
    if _seconds and cache is not None and not hasattr(session.config, "workerinput"):
        cache.set(DURATIONS_KEY, {**cache.get(DURATIONS_KEY, {}),
                                  **{k: round(v, 2) for k, v in _seconds.items()}})


def pytest_unconfigure(config):
    units = getattr(config, "_course_units", None)
    if units is not None:
        shutil.rmtree(units, ignore_errors=True)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup" or not hasattr(config, "_course_units"):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SharedFixtureScheduling(LoadGroupScheduling):
        """loadgroup, with the groups the workers wrote (tests sharing a fixture, or marked
        xdist_group): one unit each, handed to one worker."""

        _units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._units is None:
                self._units = {}
                for path in sorted(config._course_units.glob("*.json")):
                    self._units = json.loads(path.read_text())
                    break  # every worker collects the same tests
            return self._units.get(nodeid) or super()._split_scope(nodeid)

    return SharedFixtureScheduling(config, log)


def _shared_fixture(item) -> str | None:
    """The group of an item that uses a fixture worth sharing: ``smoke_run``, or a fixture of
    its test file that lives for the module (or class), e.g. test_scaling's ``launched``."""
    marked = sorted(str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group"))
    if marked:
        return "_".join(marked)
    if "smoke_run" in item.fixturenames:
        return SMOKE_GROUP
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and defs[-1].baseid and defs[-1].scope in ("module", "class"):
            return f"{item.nodeid.split('::')[0]}::{name}"
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """On an xdist worker: the tests of one group together, the longest units first (by the
    seconds of the last run in pytest's cache; without them the smoke group, then groups and
    tests marked slow or notebook), and the groups written where the scheduler reads them."""
    where = getattr(config, "workerinput", {}).get(UNITS_DIR)
    if where is None:
        return  # one process: file order
    cache = getattr(config, "cache", None)
    last = cache.get(DURATIONS_KEY, {}) if cache is not None else {}
    units: dict[str, str] = {}  # node id -> its group
    seconds: dict[str, float] = {}  # unit (group or node id) -> its seconds, or a guess
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        group = _shared_fixture(item)
        if group is not None:
            units[item.nodeid] = f"group:{group}"
        unit = units.get(item.nodeid, item.nodeid)
        guess = (120.0 if group == SMOKE_GROUP else
                 10.0 if item.get_closest_marker("slow") or item.get_closest_marker("notebook")
                 else 5.0 if group is not None else 0.1)
        seconds[unit] = seconds.get(unit, 0.0) + last.get(item.nodeid, guess)
        first.setdefault(unit, index)
    unit_of = [units.get(item.nodeid, item.nodeid) for item in items]
    order = sorted(range(len(items)),
                   key=lambda i: (-seconds[unit_of[i]], first[unit_of[i]], i))
    items[:] = [items[i] for i in order]
    target = Path(where) / f"{config.workerinput['workerid']}.json"
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(units))
    partial.replace(target)
