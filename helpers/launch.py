"""Child processes, one way: a script run in a process of its own (``python script.py``, notebook
04's legacy apex.amp script) or on N ranks under torchrun (``python -m torch.distributed.run``,
notebook 07's training script, several launches at once), a plan in and a JSON result out.

- the protocol: the parent passes ``--plan JSON --out PATH``; the child reads them with
  :func:`read_plan` and writes its result atomically with :func:`write_result`;
- the environment: the caller's, the course's checkout first on ``PYTHONPATH`` and the caller's
  ``PYTHONPATH`` after it (:func:`child_env`); the child runs from the checkout;
- the deadline: :func:`run_all` starts every child before it waits for the first, then waits at
  most ``timeout`` seconds for all of them; past it, or when the wait itself is interrupted, it
  stops each child's whole process group and every process the child moved into a group of its
  own (torchrun's ranks), by id (:func:`stop`). After a child exits, what is left of its group
  is stopped too: no process outlives its launch;
- the temporary files: each launch gives its children a ``TMPDIR`` of its own and removes it
  when they ended (torchrun leaves a ``torchelastic_*`` folder per launch otherwise);
- the failure: one sentence, the exit code (or signal) and the child's last error line
  (:func:`failure_sentence`), or for torchrun the rank that failed first and its last error.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from helpers.results import atomic_write_text

CHECKOUT = Path(__file__).resolve().parent.parent  # the folder that holds helpers/: the course
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # what the torchrun command runs
PAST_LIMIT = ("the child process ran past {timeout:.0f} s and was stopped with every process it "
              "started: raise its timeout")  # the default sentence for a child past its deadline


# ------------------------------------------------------------------ the command and environment
def python(script: Path | str, args: list[str] | tuple = ()) -> list[str]:
    """``python script.py ARGS`` with this Python."""
    return [sys.executable, str(Path(script).resolve()), *args]


def torchrun(script: Path | str, nproc: int, args: list[str] | tuple = (), *,
             port: int | None = None) -> list[str]:
    """The torchrun command line: ``--standalone`` (a free port picked by torchrun) unless a
    ``port`` is given, then a static rendezvous at 127.0.0.1:port."""
    where = (["--standalone"] if port is None else
             ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1", f"--master_port={port}"])
    return [*TORCHRUN, *where, f"--nproc_per_node={nproc}", str(Path(script).resolve()), *args]


def _is_torchrun(cmd: list[str]) -> bool:
    return cmd[:len(TORCHRUN)] == TORCHRUN


def python_path(*first: Path | str) -> str:
    """``first``, then the checkout, then the caller's ``PYTHONPATH``; each folder once."""
    paths = [str(p) for p in first] + [str(CHECKOUT)]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(paths))


def child_env(*first: Path | str, **changes: str | None) -> dict[str, str]:
    """This process's environment for a child: :func:`python_path` of ``first`` as its
    ``PYTHONPATH``, and ``changes`` set (a value of None removes that variable)."""
    env = dict(os.environ, PYTHONPATH=python_path(*first))
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


# ------------------------------------------------------------------ the launch
@dataclass
class Result:
    """One child: its command, how it ended, what it printed, its JSON result."""

    cmd: list[str]
    out: Path
    returncode: int | None = None  # None: it never started, or it was stopped
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    payload: dict = field(default_factory=dict)
    error: str = ""  # one sentence; '' when the child finished and wrote its result

    @property
    def ok(self) -> bool:
        """True when the child finished and wrote its result."""
        return not self.error


@dataclass
class Job:
    """A child to start: ``program`` (:func:`python` or :func:`torchrun`, without the plan),
    its plan and where its result goes. ``env``: :func:`child_env` when None. ``refused``: the
    one sentence why it must not start (it is not started then). ``past_limit``: its sentence
    past the deadline, ``{timeout}`` the limit in seconds."""

    program: list[str]
    plan: dict
    out: Path | str
    env: dict[str, str] | None = None
    refused: str = ""
    past_limit: str = PAST_LIMIT


def run(program: list[str], plan: dict, out: Path | str, *, timeout: float,
        env: dict[str, str] | None = None, past_limit: str = PAST_LIMIT) -> Result:
    """:func:`run_all` of one child."""
    return run_all([Job(program, plan, out, env, past_limit=past_limit)], timeout=timeout)[0]


def scratch_env(env: dict[str, str], scratch: Path | str) -> dict[str, str]:
    """``env`` with ``TMPDIR`` set to ``scratch``, the launch's own temporary folder (torchrun
    makes a ``torchelastic_*`` folder there per launch, and leaves it), while torch.compile's
    cache stays where it was, so that it lasts from one launch to the next."""
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())  # as torch names its default
    except (KeyError, OSError):  # no name for this user id
        user = str(os.getuid())
    cache = env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{user}")
    return {**env, "TMPDIR": str(scratch), "TORCHINDUCTOR_CACHE_DIR": cache}


def run_all(jobs: list[Job], *, timeout: float) -> list[Result]:
    """Start every job, then wait for them all until ``timeout`` seconds after the last one
    started (on CPUs, one child's idle time is another's work); read what each left. The
    children's temporary files go into a folder of this launch, removed once they all ended."""
    started: list[tuple[Job, Result, subprocess.Popen | None, tuple]] = []
    scratch = tempfile.mkdtemp(prefix="course-launch-")
    try:
        for job in jobs:
            out = Path(job.out)
            result = Result([*job.program, "--plan", json.dumps(job.plan), "--out", str(out)],
                            out, error=job.refused)
            if job.refused:
                started.append((job, result, None, ()))
                continue
            out.unlink(missing_ok=True)
            logs = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            started.append((job, result, None, logs))
            env = scratch_env(child_env() if job.env is None else job.env, scratch)
            proc = subprocess.Popen(result.cmd, cwd=CHECKOUT, env=env,
                                    stdout=logs[0], stderr=logs[1], text=True,
                                    start_new_session=True)  # its own process group
            started[-1] = (job, result, proc, logs)
        begin = time.perf_counter()
        for job, result, proc, logs in started:
            if proc is not None:
                _finish(job, result, proc, logs, begin, timeout)
    except BaseException:  # Ctrl-C while waiting, for one: no child outlives the launch
        for _, _, proc, _ in started:
            if proc is not None and proc.poll() is None:
                stop(proc)
        raise
    finally:
        for _, _, _, logs in started:
            for log in logs:
                log.close()
        shutil.rmtree(scratch, ignore_errors=True)  # torchrun's torchelastic_* folders with it
    return [result for _, result, _, _ in started]


def _finish(job: Job, result: Result, proc: subprocess.Popen, logs: tuple, begin: float,
            timeout: float) -> None:
    """Wait for one child until ``begin + timeout``, stop it past that, read what it left."""
    try:
        proc.wait(timeout=max(0.0, begin + timeout - time.perf_counter()))
        _sweep(proc.pid)  # what the child left running in its group
    except subprocess.TimeoutExpired:
        stop(proc)
        result.error = job.past_limit.format(timeout=timeout)
    result.seconds = time.perf_counter() - begin
    for log in logs:
        log.seek(0)
    result.stdout, result.stderr = logs[0].read(), logs[1].read()
    result.returncode = proc.returncode
    torchrun_ = _is_torchrun(result.cmd)
    if result.error:
        return
    if proc.returncode != 0:
        result.error = failure_sentence(result.stderr, proc.returncode,
                                        who="torchrun" if torchrun_ else "the child process")
    elif not result.out.exists():
        result.error = (f"every rank exited with 0 but rank 0 wrote no result to {result.out}"
                        if torchrun_ else
                        f"the child process exited with 0 but wrote no result to {result.out}")
    else:
        try:
            result.payload = json.loads(result.out.read_text())
        except (OSError, ValueError) as exc:
            result.error = f"the result {result.out} is not readable JSON ({exc})"


# ------------------------------------------------------------------ stopping, by id
def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of /proc/PID/stat), None if it is gone."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid`` (Linux /proc), with their start times."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(stat.parent.name)
        if fields and len(fields) > 19 and int(fields[1]) == pid:
            found[int(stat.parent.name)] = fields[19]
    return found


def stop(proc: subprocess.Popen) -> None:
    """End a child started in a session of its own and every process it started, by id:
    SIGTERM to its process group (torchrun stops its ranks), then SIGKILL; then each of its
    children that moved into a process group of its own (torchrun's ranks)."""
    moved = _children(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue
    _sweep(proc.pid)
    for pid, started in moved.items():
        if _process_start(pid) == started:  # still the process it was, not a new one
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _sweep(group: int) -> None:
    """SIGKILL what is left of the process group of an exited child (its leader, ``group``).
    While any process is left in the group, its id cannot be taken by a new process; a process
    that has that id now means the group is gone and the id another's."""
    if _stat(group) is not None:
        return
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------ one sentence
_ERROR_LINE = re.compile(r"^(?:\[rank(\d+)\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*)$")
_TORCHRUN_REPORT = " failed (exitcode"  # where torchrun's own report of a failed rank starts


def _last_said(stderr: str) -> list[str]:
    """The last line the child (or the ranks) wrote, before torchrun's own report, tracebacks'
    frames and log lines left out (``errors.stop`` in a child ends it with its sentence alone)."""
    head, report, _ = stderr.partition(_TORCHRUN_REPORT)
    lines = head.splitlines()[:-1] if report else head.splitlines()  # not the report's own line
    said = [ln.strip() for ln in lines
            if ln.strip() and not ln.startswith((" ", "Traceback", "[W", "W1", "E1", "I1"))]
    return said[-1:]


def last_error(stderr: str, rank: str | None = None) -> str:
    """The child's last error line in ``stderr``: its last ``SomethingError: ...`` line (of
    ``rank``'s, for torchrun, whose ranks prefix theirs ``[rankN]:``), else the last line it
    wrote; '' when it wrote none."""
    found = [m for m in map(_ERROR_LINE.match, stderr.splitlines())
             if m and "ChildFailedError" not in m.group(2)]  # not torchrun's own summary
    mine = [m.group(2) for m in found if rank is None or m.group(1) == rank]
    if rank is not None and not mine:  # a rank that failed before its process group: no [rankN]
        mine = [m.group(2) for m in found if m.group(1) is None]
    said = (mine or _last_said(stderr))[-1:]
    return said[0][:300] if said else ""


def failure_sentence(stderr: str, returncode: int | None, who: str = "the child process") -> str:
    """One sentence for a child that failed, read from what it wrote to stderr: how it ended
    and its last error. For torchrun (``who``), its report: the rank that failed first, a
    rendezvous port in use, the nccl backend in a torch without NCCL."""
    if "EADDRINUSE" in stderr or "address already in use" in stderr.lower():
        port = re.search(r"port:\s*(\d+)", stderr)
        where = f"port {port.group(1)}" if port else "the rendezvous port"
        return (f"{where} is already in use, so torchrun could not open its rendezvous store "
                f"there (it exited with {returncode}): free the port, pass another one, or "
                "launch with --standalone, which picks a free port itself")
    if "NCCL built in" in stderr:
        return ("this torch has no NCCL (a CPU-only build), so the nccl backend cannot start: "
                "use backend 'gloo' on the CPU, or install a CUDA build of torch")
    cause = stderr.split("Root Cause", 1)[1] if "Root Cause" in stderr else ""
    rank = re.search(r"rank\s*:\s*(\d+)", cause)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", cause)
    if rank and code:
        killed = int(code.group(1)) < 0
        how = (f"was killed by signal {-int(code.group(1))}" if killed
               else f"exited with code {code.group(1)}")
        said = last_error(stderr, rank.group(1))
        return (f"rank {rank.group(1)} {how}, the first failure torchrun saw; it stopped the "
                f"other ranks and exited with {returncode}"
                + (f"; its last error: {said}" if said else ""))
    how = (f"was killed by signal {-returncode}" if returncode is not None and returncode < 0
           else f"exited with {returncode}")
    said = last_error(stderr)
    return f"{who} {how}" + (f"; its last error: {said}" if said else "")


# ------------------------------------------------------------------ the child's side
def read_plan(argv: list[str] | None = None, *, description: str = "a course script",
              check: Callable[[dict], str] | None = None) -> tuple[dict, Path]:
    """The child's ``--plan JSON --out PATH``, what :func:`run` passes. ``check(plan)`` returns
    '' or the one sentence why the plan cannot run: then the child exits with status 2 and
    that sentence (argparse's usage error)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--plan", required=True, help="the plan, as JSON")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON result goes")
    args = parser.parse_args(argv)
    try:
        plan = json.loads(args.plan)
    except ValueError as exc:
        parser.error(f"--plan is not JSON ({exc})")
    problem = check(plan) if check is not None else ""
    if problem:
        parser.error(problem)
    return plan, args.out


def write_result(out: Path | str, payload: dict) -> Path:
    """The child's JSON result, written atomically for the parent to read."""
    return atomic_write_text(out, json.dumps(payload, indent=1) + "\n")
