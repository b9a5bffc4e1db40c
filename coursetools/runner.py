"""Execute the course's notebooks headless with papermill, each run into a fresh folder.

Each run goes into a new folder (``build/run-7``: executed copies, ``results/``,
``summary.json``); a complete one becomes --out (a link; ``--report``, as make report: a folder,
reports/<gpu>) and older runs go, a failed one stays. All is checked before any notebook starts,
each --param against the rules of the notebooks' ``errors.check_parameters`` call."""

from __future__ import annotations

import argparse
import ast
import difflib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

try:
    import nbformat
    import papermill
    import torch

    from helpers.run_profile import resolve
except ModuleNotFoundError as _missing:  # a Python without the course's packages
    if __name__ != "__main__":
        raise
    sys.exit(f"runner: error: this Python ({sys.executable}) has no {_missing.name}: run the "
             "notebooks with 'make run', or with the course's Python: "
             ".venv/bin/python -m coursetools.runner")

from helpers import errors, settings
from helpers.errors import CourseError, one_line
from helpers.results import NO_SPACE, atomic_write_text, folder_bytes, megabytes, no_space, slug

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHAPTER_GLOB = "[0-9][0-9]_*.ipynb"  # a chapter is notebooks/NN_<topic>.ipynb; NN orders them
OTHER_OUT = "choose {} with --out (make run OUT=...)"
logging.getLogger("papermill").setLevel(logging.ERROR)  # the runner checks parameters itself
for _name in ("asyncio", "traitlets"):  # a kernel stopped by Ctrl-C: its tasks say it once
    logging.getLogger(_name).setLevel(logging.CRITICAL)


class Engine(papermill.engines.NBClientEngine):
    """papermill's nbclient engine, saving the executed copy every 5 s at most, and at its end."""
    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        save = nb_man.save  # papermill's own saves before and after each cell: 1/8 of a smoke run
        nb_man.save = lambda **_: (nb_man.now() - nb_man.last_save_time).seconds >= 5 and save()
        try:  # a cell's error, a timeout, Ctrl-C: papermill's last save still writes it all
            super().execute_managed_notebook(nb_man, kernel_name, **kwargs)
        finally:
            nb_man.save = save


papermill.engines.papermill_engines.register("course", Engine)


def course_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The course's notebooks in their order, found in ``folder``: no list to edit for a new one."""
    return sorted(folder.glob(CHAPTER_GLOB))


class UnreadableNotebook(CourseError):
    """A notebook file that is not a notebook (cut short, not JSON)."""


def read_notebook(path: Path):
    """The notebook at ``path``, or :class:`UnreadableNotebook` naming it with the fix."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        json.loads(text)  # its error says where a file cut short breaks off
        return nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - cut short, not a notebook, not there
        why = f"not JSON: {exc}" if isinstance(exc, json.JSONDecodeError) else one_line(exc)
    name = os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else path
    raise UnreadableNotebook(f"{name} is not a readable notebook ({why}): restore it with 'git "
                             f"checkout -- {name}' (or see what changed with 'git diff -- {name}')")


@dataclass
class NotebookRun:
    """The outcome of one notebook; ``status`` 'ok', 'FAILED' or 'interrupted'."""
    name: str
    seconds: float
    status: str
    output: Path
    error: str = ""
    parameters: dict | None = None  # the ones set with --param (this notebook defines them)
    peak_gpu_gib: float | None = None  # GPU memory in use at its peak, all processes (nvidia-smi)
    ok = property(lambda self: self.status == "ok")


def parse_params(items: list[str]) -> dict:
    """``["widths=(64, 128)"]`` -> ``{"widths": [64, 128]}`` (papermill writes no tuple)."""
    params = {}
    for item in items:
        name, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not name.isidentifier():
            raise CourseError(f"--param {item!r} is not NAME=VALUE, e.g. --param amp_dtype=fp16")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):  # a word: the string
            value = raw
        params[name] = list(value) if isinstance(value, tuple) else value
    return params


def parameters(nb) -> tuple[set[str], dict]:
    """Its parameters cell's names (papermill's reading skips '# >= 1') and parameter rules."""
    cell = next((c for c in nb.cells if "parameters" in c.metadata.get("tags", [])), None)
    names = {t.id for node in ast.parse(cell.source if cell else "").body
             if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    for cell in (c for c in nb.cells if "check_parameters" in c.source):
        try:
            call = next(n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Call)
                        and ast.unparse(n.func).endswith("check_parameters"))
            types = {t.__name__: t for t in (int, float, str, bool, list, tuple, dict, type)}
            return names, eval(compile(ast.Expression(call.args[1]), "rules", "eval"),  # noqa: S307
                               {"__builtins__": {}}, types)
        except Exception:  # noqa: BLE001 - no plain rules: the notebook checks them itself
            continue
    return names, {}


def check_params(paths: list[Path], params: dict) -> None:
    """Each --param is defined by a notebook, and each notebook that defines it takes it."""
    found = [(p.name[:2], *parameters(read_notebook(p))) for p in (paths if params else [])]
    for name, value in params.items():
        takers = [(label, rules) for label, names, rules in found if name in names]
        if not takers:
            raise CourseError(f"no notebook here has a parameter {name!r}: see the parameters "
                              "cell (the first code cell) of each notebook")
        wants = {label: want for label, rules in takers if name in rules
                 and (want := errors.parameter_problem(value, rules[name]))}
        if wants:
            raise CourseError(
                f"--param {name}={value} (make run PARAMS=...): {name} must be "
                f"{next(iter(wants.values()))} (notebook{'s' * (len(wants) > 1)} "
                f"{', '.join(wants)}), not {type(value).__name__} {value!r}: change it on the "
                "command line, or leave it out to keep the parameters cell's value")


def execute(path: Path, out_dir: Path, *, profile: str = "auto", timeout: int = 900,
            notebook_timeout: float | None = None, params: dict | None = None) -> NotebookRun:
    """Execute one notebook with papermill into ``out_dir``, written whatever happens."""
    try:
        source = read_notebook(path)
    except UnreadableNotebook as exc:  # named, and the run goes on with the next notebook
        return NotebookRun(path.name, 0.0, "FAILED", path, str(exc))
    target, results = (out_dir / path.name).resolve(), (out_dir / "results").resolve()
    wanted = {k: v for k, v in (params or {}).items() if k in parameters(source)[0]}
    run = NotebookRun(path.name, 0.0, "ok", target, parameters=wanted or None)
    # the GPU memory in use, all processes (what a smaller card would hold), every 0.2 s
    smi = shutil.which("nvidia-smi") if profile == "full" else None
    sampler = smi and subprocess.Popen(
        [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms=200", "--id="
         + (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]], stdout=subprocess.PIPE)
    start = time.perf_counter()
    deadline = start + (notebook_timeout or float("inf"))
    kernel_env = dict(COURSE_PROFILE=profile, COURSE_RESULTS_DIR=str(results), COURSE_HEADLESS="1",
                      PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
                          filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        results.mkdir(parents=True, exist_ok=True)
        with mock.patch.dict(os.environ, kernel_env):  # for this notebook's kernel only
            papermill.execute_notebook(
                str(path.resolve()), str(target), parameters=wanted, kernel_name="python3",
                language="python", progress_bar=False, cwd=str(path.resolve().parent),
                execution_timeout=timeout, engine_name="course",
                timeout_func=lambda _: max(1, int(min(timeout, deadline - time.perf_counter()))),
                extra_arguments=["--IPKernelApp.log_level=CRITICAL"])  # not the kernel's own log
    except papermill.PapermillExecutionError as exc:  # its cell numbered as a reader counts
        tags = [c.metadata.get("tags", []) for c in source.cells]
        after = next((i for i, t in enumerate(tags) if "parameters" in t and wanted), len(tags))
        number = exc.cell_index + (exc.cell_index <= after)  # from 1, every cell, as ruff does
        first, evalue = (str(s).strip().partition("\n")[0] for s in (exc.source, exc.evalue))
        run.status, run.error = "FAILED", f"{exc.ename}: {evalue} (cell {number}: {first!r})"
    except KeyboardInterrupt:  # Ctrl-C: what ran is in the executed copy
        run.status, run.error = "interrupted", "interrupted (Ctrl-C)"
    except Exception as exc:  # noqa: BLE001 - a kernel that died, a timeout, a full disk
        run.status, run.error = "FAILED", one_line(exc) + f" (writing {target})" * no_space(exc)
    run.seconds = time.perf_counter() - start
    if sampler:  # its pipe holds half an hour of samples
        time.sleep(0.3)  # the sample of the notebook's last moments
        sampler.terminate()
        mib = [int(v) for v in sampler.communicate()[0].split() if v.isdigit()]
        run.peak_gpu_gib = max(mib) / 1024 if mib else None
    return run


def run_all(paths: list[Path], out_dir: Path, **kwargs) -> list[NotebookRun]:
    """:func:`execute` each notebook, then its time table line; stop at Ctrl-C or a full disk."""
    runs, width = [], max((len(p.name) for p in paths), default=8)
    for path in paths:
        try:
            print(f"running {path.name} (profile {kwargs.get('profile', 'auto')}) ...", flush=True)
            runs.append(run := execute(path, out_dir, **kwargs))
        except KeyboardInterrupt:  # between two notebooks: the next one is interrupted
            runs.append(run := NotebookRun(path.name, 0.0, "interrupted", out_dir / path.name))
        gpu = f"  {run.peak_gpu_gib:5.1f} GiB GPU" if run.peak_gpu_gib else ""
        set_ = ", ".join(f"{k}={v!r}" for k, v in (run.parameters or {}).items())
        print(f"{run.name:<{width}}  {run.seconds:7.1f} s{gpu}  {run.status}"
              + f" - {run.error}" * (not run.ok) + f"  ({set_})" * bool(set_), flush=True)
        if run.status == "interrupted" or NO_SPACE in run.error:
            break  # on a full disk, every notebook after it would fail the same way
    return runs


def write_summary(folder: Path, runs: list[NotebookRun], profile: str, params: dict) -> None:
    """``summary.json``: the environment header's stamp, and each notebook's status, time, GPU."""
    from helpers import environment  # torch's CUDA in this process only once the run is over

    env = environment.environment_report()
    notebooks = {r.name: {"ok": r.ok, "status": r.status, "seconds": round(r.seconds, 1),
                          "peak_gpu_gib": r.peak_gpu_gib and round(r.peak_gpu_gib, 2),
                          "parameters": r.parameters or {}, "error": r.error} for r in runs}
    stamp = {**env, "cuda": env.get("torch_cuda"), "profile": profile, "parameters": params,
             "notebooks": notebooks}
    atomic_write_text(folder / "summary.json", json.dumps(stamp, indent=2) + "\n")


def run_folders(out: Path) -> list[Path]:
    """The runs' folders beside ``out``: ``<out>-1``, ``<out>-2``, ..."""
    return [p for p in out.parent.glob(f"{out.name}-*") if p.name[len(out.name) + 1:].isdigit()]


def finish(out: Path, folder: Path, complete: bool, link: bool = True) -> None:
    """A complete run becomes ``out`` (a link, or the folder); the run folders but these go."""
    if complete:
        if out.is_dir() and not out.is_symlink():  # a report, or a run from before runs had
            shutil.rmtree(out)  # folders of their own
        out.unlink(missing_ok=True)
        out.symlink_to(folder.name) if link else folder.rename(out)
    for old in run_folders(out):
        if old.resolve() not in (out.resolve(), folder.resolve()):
            shutil.rmtree(old, ignore_errors=True)


def space_sentence(out: Path) -> str:
    """The one sentence for a disk without room for a run the size of the last."""
    folder = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    free, need = shutil.disk_usage(folder).free, folder_bytes(out)
    room = (f"has {megabytes(free)} free, and a run needs about {megabytes(need)} (the last "
            "run's size)" if need else f"is full ({megabytes(free)} free)")
    return f"the disk holding {folder.resolve()} {room}: free space there, or " + (
        OTHER_OUT.format("a folder on another disk"))


def check_first(out: Path, environ) -> None:
    """The settings are the course's, and a run fits beside ``out``; else one sentence."""
    if environ.get("COURSE_RESULTS_DIR"):  # a run keeps its tables beside its notebooks
        raise CourseError(f"COURSE_RESULTS_DIR={environ['COURSE_RESULTS_DIR']} is set, but a "
                          "run keeps its tables beside its notebooks, in <out>/results: unset it "
                          "('unset COURSE_RESULTS_DIR') and " + OTHER_OUT.format("its folder"))
    for name in sorted(n for n in environ if n.startswith("COURSE_") and n not in settings.KNOWN):
        for close in difflib.get_close_matches(name, settings.KNOWN, n=1, cutoff=0.85):
            raise CourseError(f"{name} is not a course setting (did you mean {close}?): rename "
                              f"it, or unset {name}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_name(f".{out.name}.lock").touch()
        full = shutil.disk_usage(out.parent).free < folder_bytes(out)
    except OSError as exc:
        if not (full := no_space(exc)):
            raise CourseError(f"cannot write the run's output to {out} ({exc.strerror}: "
                              f"{exc.filename}): {OTHER_OUT.format('a writable folder')}") from None
    if full:
        raise CourseError(space_sentence(out))


def main(argv: list[str] | None = None) -> int:
    """Command line: exit 0 all ok, 1 a notebook failed, 2 refused first, 130 interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, help="default: build/run, or reports/<gpu>")
    parser.add_argument("--profile", default=os.environ.get("COURSE_PROFILE", "auto"))
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--check", action="store_true", help="only check, then exit")
    parser.add_argument("--report", action="store_true", help="a reference run (make report)")
    args = parser.parse_args(argv)
    paths = args.notebooks or course_notebooks()
    try:
        params = parse_params(args.param)  # --param profile=...: the run's own, recorded
        profile = resolve(params.pop("profile", "full" if args.report else args.profile)).name
        if args.report and not args.out:  # reports/h200 for an NVIDIA H200
            args.out = ROOT / "reports" / slug(torch.cuda.get_device_name()).removeprefix("nvidia-")
        out = (args.out or ROOT / "build" / "run").absolute()
        if missing := [str(p) for p in paths if not p.exists()]:
            raise CourseError(f"no such notebook: {', '.join(missing)}")
        check_first(out, os.environ)
        check_params(paths, params)
        held = open(out.with_name(f".{out.name}.lock"), "a")  # noqa: SIM115 - closed below
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one run at a time into out
        except BlockingIOError:
            held.close()
            raise CourseError(f"another run is writing to {out} now: wait for it to end, or "
                              + OTHER_OUT.format("another folder")) from None
    except CourseError as exc:
        print(f"runner: error: {exc}", file=sys.stderr)
        return 2
    with held:
        return 0 if args.check else run(paths, out, profile, params, args)


def run(paths: list[Path], out: Path, profile: str, params: dict, args) -> int:
    """:func:`main`'s run, once every check passed and the lock is held."""
    number = max((int(p.name.rsplit("-", 1)[1]) for p in run_folders(out)), default=0) + 1
    folder, runs, full = out.with_name(f"{out.name}-{number}"), [], False
    folder.mkdir()
    last = (f"{out} still holds the last complete run" if out.exists() else
            f"there is no complete run in {out} yet")
    try:
        runs = run_all(paths, folder, profile=profile, params=params)
        if not (full := any(NO_SPACE in r.error for r in runs)):
            write_summary(folder, runs, profile, params)
    except OSError as exc:  # the summary's write
        if not (full := no_space(exc)):
            raise
    print(f"total {sum(r.seconds for r in runs):.1f} s")
    if full:  # what it wrote would not be whole
        shutil.rmtree(folder, ignore_errors=True)
        print(f"runner: error: {space_sentence(out)}; this run was removed and {last}",
              file=sys.stderr)
        return 1
    failed = [r for r in runs if not r.ok]
    finish(out, folder, len(runs) == len(paths) and not failed, link=not args.report)
    why = [f"{r.name} {r.status}" for r in failed] + [
        f"{len(paths) - len(runs)} of {len(paths)} not run"] * (len(runs) < len(paths))
    print(f"this run is incomplete ({', '.join(why)}): it is in {folder}; {last}" if why else
          f"executed notebooks and results: {out}")
    for r in failed:
        see = f"\n  see {r.output}" if r.output.is_relative_to(folder) else ""
        print(f"FAILED {r.name}: {r.error}{see}", file=sys.stderr)
    return 130 if any(r.status == "interrupted" for r in runs) else 1 if why else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before or after the notebooks
        sys.exit(130)
