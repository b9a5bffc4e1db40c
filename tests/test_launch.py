"""helpers.launch on plain Python children: deadlines, clean exits, one-sentence failures."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from helpers import launch

ROOT = Path(__file__).resolve().parent.parent
# a child, one in its group, with OWN one in its own session (as torchrun's ranks), a tmp folder
SPAWNS = """import json, os, subprocess, sys, tempfile, time
sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
pids = [os.getpid(), subprocess.Popen(sleep).pid]
if OWN: pids.append(subprocess.Popen(sleep, start_new_session=True).pid)
made = tempfile.mkdtemp(prefix="torchelastic_")
print(json.dumps([pids, made, os.environ["TORCHINDUCTOR_CACHE_DIR"]]), flush=True)
"""


def _alive_after(pids: list[int], within: float = 5.0) -> list[int]:
    """The ``pids`` still running after ``within`` s (then killed, by id); zombies are gone."""
    def gone(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
        except (OSError, IndexError):
            return True

    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not all(map(gone, pids)):
        time.sleep(0.05)
    for pid in (alive := [pid for pid in pids if not gone(pid)]):
        os.kill(pid, signal.SIGKILL)
    return alive


@pytest.mark.parametrize("own, tail, timeout, error", [
    (True, "time.sleep(60)", 2, launch.PAST_LIMIT.format(timeout=2)),
    (False, "{}['missing']", 30, "the child process exited with 1; its last error: KeyError: "
                                 "'missing'")])
def test_a_child_past_its_deadline_or_failing_leaves_no_process_or_folder_behind(
        tmp_path, monkeypatch, own, tail, timeout, error):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    child = [sys.executable, "-c", SPAWNS.replace("OWN", str(own)) + tail]
    result = launch.run(child, {}, tmp_path / "o.json", timeout=timeout)
    assert result.error == error and result.seconds < 20 and result.payload == {}
    assert result.returncode == (-signal.SIGTERM if own else 1)
    pids, made, cache = json.loads(result.stdout)
    assert len(pids) == 2 + own and _alive_after(pids) == [], result.stdout
    assert Path(made).parent.name.startswith("course-launch-") and not Path(made).parent.exists()
    assert Path(cache).parent == Path(launch.tempfile.gettempdir())  # torch.compile's cache stays


def test_every_failure_is_one_sentence(tmp_path):
    bodies = {
        "sentence": "from helpers import errors\nerrors.stop('COURSE_X=y is not a number: set it')",
        "refused": "from helpers import launch\n"
                   "launch.read_plan(check=lambda plan: '' if plan.get('ok') else "
                   "'the plan lacks ok: pass ok=True')\n",
        "signal": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "silent": "print('no result written')\n"}  # a stale result of an earlier run: none
    jobs = [launch.Job([sys.executable, "-c", body], {"ok": False}, tmp_path / f"{name}.json")
            for name, body in bodies.items()]
    (tmp_path / "silent.json").write_text('{"stale": true}')
    jobs.append(launch.Job(["false"], {}, tmp_path / "never.json", refused="it cannot start"))
    results = dict(zip([*bodies, "never"], launch.run_all(jobs, timeout=60), strict=True))
    said = {name: r.error for name, r in results.items()}
    assert said["sentence"] == ("the child process exited with 1; its last error: COURSE_X=y "
                                "is not a number: set it")
    assert said["refused"] == ("the child process exited with 2; its last error: -c: error: the "
                               "plan lacks ok: pass ok=True")  # argparse's, by the program's name
    assert said["signal"] == "the child process was killed by signal 9"
    assert said["silent"] == ("the child process exited with 0 but wrote no result to "
                              f"{tmp_path / 'silent.json'}") and not results["silent"].payload
    assert said["never"] == "it cannot start" and results["never"].returncode is None


def test_children_launched_together_run_at_the_same_time(tmp_path):
    marker = str(tmp_path / "second.started")  # the first exits 0 once the second has started
    wait = (f"import os, sys, time\nfor _ in range(750):\n    if os.path.exists({marker!r}): "
            "sys.exit(0)\n    time.sleep(0.02)\nsys.exit(1)")
    touch = f"import pathlib; pathlib.Path({marker!r}).touch()"
    a, _ = launch.run_all([launch.Job([sys.executable, "-c", wait], {}, tmp_path / "a.json"),
                           launch.Job([sys.executable, "-c", touch], {}, tmp_path / "b.json")],
                          timeout=60)
    assert a.returncode == 0, a.error


def test_the_plan_reaches_the_child_with_the_checkout_first_on_its_path(tmp_path, monkeypatch):
    shadow = tmp_path / "shadow"  # a ``helpers`` package that must not shadow the course's
    (shadow / "helpers").mkdir(parents=True)
    (shadow / "helpers" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shadow), str(ROOT), str(shadow)]))
    (script := tmp_path / "where.py").write_text(
        "import os\nimport helpers\nfrom helpers import launch\nplan, out = launch.read_plan()\n"
        "launch.write_result(out, {'pythonpath': os.environ['PYTHONPATH'], 'cwd': os.getcwd(),\n"
        "    'helpers': helpers.__file__, 'legacy': os.environ.get('LEG'), 'plan': plan})\n")
    plan = {"cfg": {"lr": 1e-4}, "name": "β ünïcode \"q\" 't'", "none": None, "big": 2**60}
    env = launch.child_env(tmp_path / "first", LEG="here", HOME=None)
    out = tmp_path / "a.json"
    plain, first = launch.run_all([launch.Job(launch.python(script), plan, out),
                                   launch.Job(launch.python(script), {}, tmp_path / "b.json",
                                              env)], timeout=60)
    assert plain.ok and first.ok and plain.payload["plan"] == plan, (plain.error, first.error)
    assert plain.cmd == [sys.executable, str(script), "--plan", json.dumps(plan), "--out",
                         str(out)]
    assert plain.payload["pythonpath"].split(os.pathsep) == [str(ROOT), str(shadow)]
    assert first.payload["pythonpath"].split(os.pathsep)[0] == str(tmp_path / "first")
    assert Path(plain.payload["helpers"]) == ROOT / "helpers" / "__init__.py"
    assert plain.payload["cwd"] == str(ROOT) and first.payload["legacy"] == "here"
    assert "HOME" not in env
