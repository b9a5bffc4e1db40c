"""The one child launcher (helpers.launch), on plain Python children: the deadline stops the
child's whole process group and the children it moved into groups of their own, an exit leaves
no process behind, a failure is one sentence, the checkout and the caller's PYTHONPATH reach
the child, and the plan and the result make the round trip. Each child is a few lines of
Python: the whole file takes a few seconds."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import launch

ROOT = Path(__file__).resolve().parent.parent


def _script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def _gone(pid: int) -> bool:
    """True when process ``pid`` has ended (a zombie waiting for its parent counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _all_gone(pids: list[int], within: float = 5.0) -> list[int]:
    """The processes of ``pids`` still running after ``within`` seconds (these are then
    stopped, by id: a failing test leaves nothing behind)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not all(map(_gone, pids)):
        time.sleep(0.05)
    alive = [pid for pid in pids if not _gone(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return alive


SPAWNS = """\
import os, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
same = subprocess.Popen(sleep)                         # in the child's own process group
own = subprocess.Popen(sleep, start_new_session=True)  # a group of its own, as torchrun's ranks
print(os.getpid(), same.pid, own.pid, flush=True)
"""
# A child that leaves a process in its group and exits: past its exit, nothing of the group is
# left. (A process it moved into a session of its own is out of reach once the child is gone:
# torchrun stops its ranks itself when one fails; the deadline stops them above.)
LEAVES = """\
import os, subprocess, sys
same = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(os.getpid(), same.pid, flush=True)
"""


def test_past_the_deadline_the_child_and_every_process_it_started_are_stopped(tmp_path):
    script = _script(tmp_path / "hangs.py", SPAWNS + "time.sleep(60)\n")
    start = time.perf_counter()
    result = launch.run(launch.python(script), {}, tmp_path / "o.json", timeout=3)
    assert time.perf_counter() - start < 20 and result.seconds < 20
    assert result.error == launch.PAST_LIMIT.format(timeout=3) and not result.ok
    assert result.returncode == -signal.SIGTERM and result.payload == {}
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 3, result.stdout
    assert _all_gone(pids) == []


def test_a_child_that_fails_leaves_no_process_behind(tmp_path):
    script = _script(tmp_path / "fails.py", LEAVES + "{}['missing']\n")
    result = launch.run(launch.python(script), {}, tmp_path / "o.json", timeout=30)
    assert result.error == "the child process exited with 1; its last error: KeyError: 'missing'"
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2 and _all_gone(pids) == []  # the one in its group, swept after it


def test_every_failure_is_one_sentence_and_several_children_run_at_once(tmp_path):
    """Five failures launched together: a traceback, errors.stop's sentence, a plan refused by
    read_plan's check (argparse: status 2), a signal, an exit 0 without a result (a stale
    result of an earlier run does not count); a refused job never starts."""
    bodies = {
        "traceback": "import json\njson.loads('{')\n",
        "sentence": "from helpers import errors\n"
                    "errors.stop('COURSE_X=y is not a number: set it to one')\n",
        "refused": "from helpers import launch\n"
                   "launch.read_plan(check=lambda plan: '' if plan.get('ok') else "
                   "'the plan lacks ok: pass ok=True')\n",
        "signal": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "silent": "print('no result written')\n",
    }
    jobs = [launch.Job(launch.python(_script(tmp_path / f"child_{name}.py", body)), {"ok": False},
                       tmp_path / f"{name}.json") for name, body in bodies.items()]
    (tmp_path / "silent.json").write_text('{"stale": true}')
    jobs.append(launch.Job(["false"], {}, tmp_path / "never.json", refused="it cannot start"))
    results = dict(zip([*bodies, "never"], launch.run_all(jobs, timeout=60), strict=True))
    said = {name: r.error for name, r in results.items()}
    assert said["traceback"].startswith("the child process exited with 1; its last error: "
                                        "json.decoder.JSONDecodeError: Expecting property")
    assert said["sentence"] == ("the child process exited with 1; its last error: COURSE_X=y "
                                "is not a number: set it to one")
    assert said["refused"].startswith("the child process exited with 2; its last error: ")
    assert said["refused"].endswith("error: the plan lacks ok: pass ok=True")
    assert said["signal"] == "the child process was killed by signal 9"
    assert said["silent"] == ("the child process exited with 0 but wrote no result to "
                              f"{tmp_path / 'silent.json'}")
    assert results["silent"].stdout == "no result written\n" and not results["silent"].payload
    assert said["never"] == "it cannot start" and results["never"].returncode is None
    assert all("\n" not in s for s in said.values())


def test_children_launched_together_run_at_the_same_time(tmp_path):
    """The first waits for a file the second writes: launched one after the other, it would
    give up and say so."""
    marker = tmp_path / "second.started"
    first = _script(tmp_path / "first.py", f"""\
        import pathlib, time
        from helpers import launch
        plan, out = launch.read_plan()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not pathlib.Path({str(marker)!r}).exists():
            time.sleep(0.02)
        launch.write_result(out, {{"saw_the_second": pathlib.Path({str(marker)!r}).exists()}})
        """)
    second = _script(tmp_path / "second.py", f"""\
        import pathlib
        from helpers import launch
        plan, out = launch.read_plan()
        pathlib.Path({str(marker)!r}).touch()
        launch.write_result(out, {{}})
        """)
    a, b = launch.run_all([launch.Job(launch.python(first), {}, tmp_path / "a.json"),
                           launch.Job(launch.python(second), {}, tmp_path / "b.json")],
                          timeout=60)
    assert a.ok and b.ok, (a.error, b.error)
    assert a.payload == {"saw_the_second": True} and a.seconds < 15


def test_the_child_gets_the_checkout_first_then_the_callers_pythonpath(tmp_path, monkeypatch):
    """A ``helpers`` package on the caller's PYTHONPATH does not shadow the course's: the
    checkout comes first; the caller's folders follow, each once; the child runs from the
    checkout."""
    shadow = tmp_path / "shadow"
    (shadow / "helpers").mkdir(parents=True)
    (shadow / "helpers" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shadow), str(ROOT), str(shadow)]))
    script = _script(tmp_path / "where.py", """\
        import os, sys
        import helpers
        from helpers import launch
        plan, out = launch.read_plan()
        launch.write_result(out, {"pythonpath": os.environ["PYTHONPATH"], "cwd": os.getcwd(),
                                  "helpers": helpers.__file__, "legacy": os.environ.get("LEG")})
        """)
    env = launch.child_env(tmp_path / "first", LEG="here", HOME=None)
    assert "HOME" not in env and env["LEG"] == "here"
    plain, first = launch.run_all([launch.Job(launch.python(script), {}, tmp_path / "a.json"),
                                   launch.Job(launch.python(script), {}, tmp_path / "b.json",
                                              env)], timeout=60)
    assert plain.ok and first.ok, (plain.error, first.error)
    assert plain.payload["pythonpath"].split(os.pathsep) == [str(ROOT), str(shadow)]
    assert first.payload["pythonpath"].split(os.pathsep) == [str(tmp_path / "first"),
                                                             str(ROOT), str(shadow)]
    assert Path(plain.payload["helpers"]) == ROOT / "helpers" / "__init__.py"
    assert plain.payload["cwd"] == str(ROOT) == str(launch.CHECKOUT)
    assert plain.payload["legacy"] is None and first.payload["legacy"] == "here"


def test_the_plan_and_the_result_make_the_round_trip(tmp_path):
    plan = {"config": {"steps": 3, "lr": 1e-4, "seed": 0}, "levels": ["O1", "O3"],
            "name": "β - ünïcode \"quoted\" 'too'", "none": None, "flag": True, "big": 2**60}
    script = _script(tmp_path / "echo.py", """\
        from helpers import launch
        plan, out = launch.read_plan()
        launch.write_result(out, {"plan": plan, "out": str(out)})
        """)
    out = tmp_path / "result.json"
    result = launch.run(launch.python(script), plan, out, timeout=60)
    assert result.ok and result.returncode == 0, result.error
    assert result.cmd == [sys.executable, str(script), "--plan", json.dumps(plan), "--out",
                          str(out)]
    assert result.payload == {"plan": plan, "out": str(out)}
    assert json.loads(out.read_text()) == result.payload  # the file the parent read
    assert launch.read_plan(["--plan", json.dumps(plan), "--out", str(out)]) == (plan, out)
    with pytest.raises(SystemExit) as refused:
        launch.read_plan(["--plan", "{not json", "--out", str(out)])
    assert refused.value.code == 2


def test_a_launch_removes_the_temporary_folders_its_children_made(tmp_path, monkeypatch):
    """The children's TMPDIR is the launch's own folder (torchrun makes a torchelastic_* folder
    there), removed once they ended, past the deadline too; torch.compile's cache stays put."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    script = _script(tmp_path / "temps.py", """\
        import json, os, sys, tempfile, time
        made = tempfile.mkdtemp(prefix="torchelastic_")
        print(json.dumps([made, os.environ["TORCHINDUCTOR_CACHE_DIR"]]), flush=True)
        time.sleep(float(sys.argv[1]))
    """)
    for sleep, timeout in ((0, 30), (60, 2)):  # ends by itself; stopped at the deadline
        result = launch.run(launch.python(script, [str(sleep)]), {}, tmp_path / "o.json",
                            timeout=timeout)
        made, cache = json.loads(result.stdout)
        assert Path(made).name.startswith("torchelastic_") and not Path(made).exists()
        assert Path(made).parent.name.startswith("course-launch-")
        assert not Path(made).parent.exists()
        assert Path(cache).parent == Path(launch.tempfile.gettempdir())
        assert Path(cache).name.startswith("torchinductor_")
