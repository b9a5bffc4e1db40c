"""Notebook 07 on the CPU: the training script of its script cell, run by torchrun on 2 gloo
ranks, matches one process (07's own CPU check, read from the shared smoke run) and catches
injected faults; the launcher's one-sentence failures (07's crash cell among them); the memory
and communication formulas against hand-computed values; the Apex map."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
import pandas as pd
import pytest
import torch

from helpers import bench, errors, gpt, machine
from helpers import launch as launcher
from helpers.chapters import scaling

if TYPE_CHECKING:
    from coursetools.runner import NotebookRun

# torch.distributed.optim (ZeroRedundancyOptimizer, resolved by the Apex map) uses torch.jit
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "07_scaling_out.ipynb"
WRITEFILE = "%%writefile {script}\n"
LEGACY_SRC = ROOT / ".apex_src" / "legacy" / "apex"

# The two faults, written into the script: the DDP run takes rank 0's slice on every rank, the
# FSDP2 run multiplies the loss it differentiates by the world size (a sum over the ranks where
# their average belongs).
SLICE = "x, y = (t[rank * per_rank:(rank + 1) * per_rank] for t in (x, y))"
WRONG_SLICE = ("x, y = (t[:per_rank] if wrapper == 'ddp' else "
               "t[rank * per_rank:(rank + 1) * per_rank] for t in (x, y))")
BACKWARD = "scaler.scale(loss).backward()"
SUMMED = "scaler.scale(loss * (world if wrapper == 'fsdp2' else 1)).backward()"
# The one-process launch as section 4 runs it on a GPU: the wrappers at world size 1, plain
# again with the same seed and with 2 others (the same-seed floor; the other seeds' spread).
NOISE = scaling.noise_variants(1, 0, other_seed=(1, 2))
ONE_PROCESS = ["plain", "ddp", "fsdp2", *NOISE]
# ... FSDP2 again with its seed (does it repeat itself?), and the variants section 4 adds on a
# GPU (compiled with aot_eager here: no C++ toolchain needed, the same dynamo and AOTAutograd
# path around the wrappers)
PROBES = {"fsdp2 (repeat 1)": 0}
EXTRA = [*PROBES, "fsdp2+noreshard", "ddp+view", "plain+ac", "fsdp2+mp",
         "fsdp2+compile"]  # (ddp+compile: on the GPU)
# The checkpoint fault: the fresh model is never loaded (it keeps its own initial weights).
LOAD = "from helpers.chapters import scaling\n"
NO_LOAD = (LOAD + "scaling.load_checkpoint = lambda model, optimizer, path: None  # never read\n")


def notebook_script() -> str:
    """The training script exactly as notebook 07's script cell writes it."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"
             and c.source.startswith(WRITEFILE)]
    assert len(cells) == 1, "notebook 07 has one %%writefile {script} cell"
    return cells[0][len(WRITEFILE):] + "\n"


def check_plan(corpus: Path, **changes) -> dict:
    """The notebook's CPU check: tiny model, fp32, gloo, 8 sequences per step (the held-out
    bytes beside the corpus, as the notebook writes them)."""
    plan = dict(cfg=dataclasses.asdict(gpt.TINY), backend="gloo", global_batch=8, accum=1,
                steps=4, warmup=1, lr=gpt.PEAK_LR, lr_warmup=2, seed=0, amp=None,
                variants=["plain"], seeds={}, corpus=str(corpus),
                val_corpus=str(corpus.with_name("val_corpus.pt")), val_batches=2, timeout_s=60,
                allreduce_mib=0, save_params=True, checkpoint_at=0, resume="fsdp2",
                compile_backend="aot_eager", rounds=0, round_steps=2)
    plan.update(changes)
    plan["variants"] = notebook_records(plan["variants"], plan.pop("seeds"), plan["seed"])
    return plan


def notebook_records(names: list[str], seeds: dict[str, int], seed: int) -> list[dict]:
    """The plan's variant records, made by the notebook's own VARIANTS cell."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    space = {"dataclasses": dataclasses, "scaling": scaling, "seed": seed}
    exec(_cell(nb, "VARIANTS = {"), space)
    return space["records"](names, seeds)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One process (plain, the wrappers at world size 1, plain's repeat and another seed,
    section 4's variants), 2 ranks with the faults, 2 ranks in fp16 + GradScaler: launched at
    once. Returns (single, faulty, seconds, fp16). The script on 2 ranks as written is notebook
    07's own CPU check, in the smoke run (:func:`check_launches`)."""
    tmp = tmp_path_factory.mktemp("scaling")
    script = notebook_script()
    assert SLICE in script and BACKWARD in script and LOAD in script, (
        "the script cell changed: update the faults")
    (tmp / "train.py").write_text(script)
    (tmp / "faulty.py").write_text(script.replace(SLICE, WRONG_SLICE).replace(BACKWARD, SUMMED)
                                   .replace(LOAD, NO_LOAD))
    corpus, data = tmp / "corpus.pt", gpt.load_corpus(cap_mb=0.5)
    torch.save(data.train, corpus)
    torch.save(data.val, tmp / "val_corpus.pt")
    two = dict(variants=["ddp", "fsdp2"], accum=2, checkpoint_at=2)  # FSDP2 saves, reloads
    start = time.perf_counter()
    single, faulty, fp16 = scaling.launch_all([
        (tmp / "train.py", 1, check_plan(corpus, variants=ONE_PROCESS + EXTRA,
                                          seeds={**NOISE, **PROBES}, rounds=2),
         tmp / "single.json"),
        (tmp / "faulty.py", 2, check_plan(corpus, **two), tmp / "faulty.json"),
        (tmp / "train.py", 2, check_plan(corpus, amp="float16", save_params=False, **two),
         tmp / "fp16.json")], timeout=240)
    for launch in (single, faulty, fp16):
        assert launch.ok, f"{launch.error}\n{launch.stderr[-3000:]}"
    return single, faulty, time.perf_counter() - start, fp16


# Notebook 07's CPU check, in the smoke run (smoke_run, tests/conftest.py): the script on one
# process and on 2 gloo ranks (DDP and FSDP2, 2 micro-batches a step, an all-reduce timed,
# FSDP2 saving a checkpoint halfway and a fresh model resuming from it), both from the same
# plan; their results and final parameters saved in the run's results folder.
CHECK_WORLD = {1: "07_check_world1.json", 2: "07_check_world2.json"}


def smoke_07(smoke_run) -> tuple[Path, NotebookRun]:
    """(out, notebook 07's run) of the smoke run, once 07 ran through."""
    out, runs = smoke_run
    run = runs[NOTEBOOK.name]  # skips, saying so, where the run left 07 out
    assert run.ok, f"notebook 07 failed: {run.error} (executed copy: {run.output})"
    return out, run


def check_launches(out: Path) -> tuple[scaling.Launch, scaling.Launch]:
    """(one process, 2 ranks): notebook 07's CPU check as it saved it under ``out/results``."""
    paths = {n: out / "results" / name for n, name in CHECK_WORLD.items()}
    single, split = (scaling.Launch(cmd=[], out=path, payload=json.loads(path.read_text()),
                                    nproc=n) for n, path in paths.items())
    return single, split


def _rows(reference: scaling.Launch, launch: scaling.Launch) -> dict[str, dict]:
    """Each run of ``launch`` compared with the one-process plain run of ``reference``."""
    plain, params = reference.runs()[0], reference.params("plain")
    return {r.extra["variant"]: scaling.compare(plain, r, params,
                                                launch.params(r.extra["variant"]))
            for r in launch.runs()}


@pytest.mark.smoke("07")
def test_two_gloo_ranks_match_one_process(smoke_run):
    out, _ = smoke_07(smoke_run)
    single, split = check_launches(out)
    plan = split.payload["plan"]
    for key in ("cfg", "global_batch", "steps", "seed", "lr", "amp"):  # the same batches
        assert single.payload["plan"][key] == plan[key], key
    rows = _rows(single, split)
    assert set(rows) == {"ddp", "fsdp2"}
    for variant, row in rows.items():
        assert row["world_size"] == 2 and row["accum"] == plan["accum"] > 1
        assert row["steps"] == plan["steps"] and scaling.within(row), (variant, row)
    losses = single.runs()[0].losses
    assert losses[-1] < losses[0]  # it trained: the comparison is not of untouched models


def test_the_launches_here_run_at_once_in_under_two_minutes(launched):
    seconds = launched[2]
    assert seconds < 120, f"the three launches took {seconds:.0f} s"


def test_the_same_comparison_catches_a_wrong_slice_and_a_missing_average(launched):
    single, faulty, _, _ = launched
    rows = _rows(single, faulty)
    wrong_slice, summed = rows["ddp"], rows["fsdp2"]
    assert not scaling.within(wrong_slice)
    assert wrong_slice["max_loss_diff"] > 100 * scaling.TOLERANCE["max_loss_diff"]
    assert not scaling.within(summed)
    # summed gradients are twice the averaged ones: the norms say so, the losses do not ...
    assert summed["max_grad_norm_rel_diff"] == pytest.approx(1.0, abs=1e-3)
    assert summed["max_loss_diff"] <= scaling.TOLERANCE["max_loss_diff"]


@pytest.mark.smoke("07")
def test_what_each_rank_holds_matches_the_memory_model(smoke_run):
    out, _ = smoke_07(smoke_run)
    _, split = check_launches(out)
    assert split.payload["plan"]["cfg"] == dataclasses.asdict(gpt.TINY)
    n = gpt.count_params(gpt.GPT(gpt.TINY))
    for run in split.runs():
        strategy = {"ddp": "DDP", "fsdp2": "FSDP2 (ZeRO-3)"}[run.extra["variant"]]
        model = formulas()["memory_per_gpu"](n, 2, strategy)
        held = run.extra["state_bytes"]
        assert (held["params"], held["grads"], held["optimizer"]) == (
            model["param"], model["grad"], model["adam"]), (strategy, held, model)


def _holds_what_the_notebook_reads(launch: scaling.Launch, steps: int) -> None:
    """Every run of ``launch``: a loss, a step time and a gradient norm per step, its tokens per
    step (8 sequences), a positive step time and throughput."""
    runs = launch.runs()
    assert runs, launch.payload
    for run in runs:
        assert len(run.losses) == len(run.step_ms) == len(run.extra["grad_norms"]) == steps
        assert run.extra["tokens_per_step"] == 8 * gpt.TINY.seq_len
        assert run.timing.median_ms > 0 and run.tokens_per_s > 0


def test_the_results_hold_what_the_notebook_reads(launched):
    single = launched[0]
    assert single.stderr.strip() == "" or "Traceback" not in single.stderr
    _holds_what_the_notebook_reads(single, 4)


@pytest.mark.smoke("07")
def test_the_notebooks_own_check_holds_what_it_reads(smoke_run):
    out, _ = smoke_07(smoke_run)
    single, split = check_launches(out)
    for launch in (single, split):
        _holds_what_the_notebook_reads(launch, launch.payload["plan"]["steps"])
    bw = split.payload["allreduce"]
    assert bw["world_size"] == 2 and bw["busbw_gbps"] == pytest.approx(bw["algbw_gbps"])
    table = scaling.runs_table(split.runs())
    assert list(table["variant"]) == ["ddp", "fsdp2"]
    assert (table["tokens_per_s_per_gpu"] * 2 == table["tokens_per_s"]).all()


# ------------------------------------------------------------------ one-sentence failures
SLEEPS = "import os, time\nprint(os.getpgrp(), flush=True)\ntime.sleep(120)\n"
# Notebook 07's crash cell launches its crashing script twice at once: rank 1 exits with code 3
# while rank 0 sleeps for a minute, and on a --master_port the notebook holds open. It prints
# one line per launch: its seconds, torchrun's exit code, the launcher's sentence.
CRASH_CELL = "with socket.socket() as taken"
CRASH_SAID = re.compile(r"(a rank dies|port (\d+) taken): (\d+\.\d) s, launcher exit code "
                        r"(-?\d+|None): (.+)")


@dataclasses.dataclass
class Said:
    """One launch of 07's crash cell, as the cell printed it."""

    port: int | None  # the port it was given (held open), None: --standalone
    seconds: float
    returncode: int | None
    error: str


def crash_cell_said(run: NotebookRun) -> tuple[Said, Said]:
    """(the launch with a rank that dies, the launch on a port in use), read from the output of
    07's crash cell in the executed notebook."""
    nb = nbformat.read(run.output, as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(CRASH_CELL)]
    text = "".join(o.text for o in cell.outputs if o.output_type == "stream"
                   and o.name == "stdout")
    found = [CRASH_SAID.fullmatch(line) for line in text.splitlines()]
    assert len(found) == 2 and all(found), text
    died, busy = (Said(int(m[2]) if m[2] else None, float(m[3]),
                       None if m[4] == "None" else int(m[4]), m[5]) for m in found)
    assert died.port is None and busy.port is not None, text
    return died, busy


@pytest.mark.smoke("07")
def test_a_rank_that_dies_is_reported_with_its_exit_code_without_a_hang(smoke_run):
    _, run = smoke_07(smoke_run)
    launch, _ = crash_cell_said(run)
    assert launch.error and launch.returncode not in (0, None)
    assert launch.error.startswith("rank 1 exited with code 3, the first failure"), launch.error
    assert f"exited with {launch.returncode}" in launch.error
    assert launch.seconds < 60, "the waiting rank was not stopped when its partner died"


@pytest.mark.slow
@pytest.mark.parametrize(("body", "said"), [
    ("plan = {}\nplan['missing']\n", "its last error: KeyError: 'missing'"),
    ("from helpers import errors\nerrors.stop('COURSE_GPU_MEMORY_GIB=x is not a number')\n",
     "its last error: COURSE_GPU_MEMORY_GIB=x is not a number")])
def test_a_rank_that_fails_before_its_process_group_names_its_error(tmp_path, body, said):
    """Lines written before init_process_group carry no [rankN] prefix: the sentence still
    quotes the error (a KeyError), or the one sentence a rank stopped with (errors.stop). Rank 0
    fails and rank 1 ends cleanly: two ranks failing in the same instant write into one stderr
    at once, and their lines interleave ("KeyErrorKeyError: : ...")."""
    guarded = "import os\nif os.environ['RANK'] == '0':\n" + "".join(
        f"    {line}\n" for line in body.splitlines())
    (tmp_path / "early.py").write_text(guarded)
    launch = scaling.launch(tmp_path / "early.py", 2, {"backend": "gloo"}, tmp_path / "o.json",
                            timeout=60)
    assert not launch.ok and launch.error.endswith(said), launch.error
    assert scaling.launch_problem("gloo", 0).startswith("0 ranks cannot start")


def test_a_parameter_below_one_stops_the_notebook_in_one_sentence():
    """The parameters cell with max_gpus = 0, then the setup cell's checks: one sentence."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    checks = next(c.source for c in nb.cells if "errors.check_parameters(" in c.source)
    space = {"machine": machine, "errors": errors}
    exec(params.source.replace("max_gpus = 8", "max_gpus = 0"), space)
    with pytest.raises(errors.CourseError, match="^max_gpus must be at least 1: fix it in the"):
        exec(checks.split("profile = resolve(profile)", 1)[0], space)
    exec(params.source.replace("noise_runs = 3", "noise_runs = 0"), space)
    with pytest.raises(errors.CourseError, match="^noise_runs must be at least 1: fix it in the"):
        exec(checks.split("profile = resolve(profile)", 1)[0], space)
    exec(params.source, space)  # as shipped: the checks pass
    assert space["lr"] is None and space["noise_runs"] >= 1
    exec(checks.split("profile = resolve(profile)", 1)[0], space)


@pytest.mark.smoke("07")
def test_a_port_in_use_is_one_sentence(smoke_run, monkeypatch):
    out, run = smoke_07(smoke_run)
    _, launch = crash_cell_said(run)
    port = launch.port
    assert launch.error.startswith(f"port {port} is already in use"), launch.error
    assert launch.seconds < 30
    # the cell's two launches, built as launch_all builds them and started nowhere
    monkeypatch.setattr(launcher, "run_all", lambda jobs, timeout: [
        launcher.Result(job.program, Path(job.out)) for job in jobs])
    crash, plan = out / "results" / "07_crash.py", {"backend": "gloo"}
    died, busy = scaling.launch_all([(crash, 2, plan, out / "07_crash.json"),
                                     (crash, 2, plan, out / "07_busy.json", port)])
    assert f"--master_port={port}" in busy.cmd and "--standalone" not in busy.cmd
    assert "--standalone" in died.cmd and not any("--master_port" in a for a in died.cmd)


@pytest.mark.slow
def test_a_launch_past_its_limit_is_stopped_with_all_its_ranks(tmp_path):
    (tmp_path / "sleeps.py").write_text(SLEEPS)
    # Both ranks must have started (and printed) before the limit: 6 s is enough on a quiet
    # machine, not always beside a second test worker (torchrun's own start slowed; a failed
    # first try then cost 6 + 30 s), so 12 s, and a second try with 30 s.
    started = set()  # the process groups of every try's ranks: all must be gone at the end
    for limit in (12, 30):
        launch = scaling.launch(tmp_path / "sleeps.py", 2, {"backend": "gloo"},
                                tmp_path / "o.json", timeout=limit)
        assert launch.error.startswith(f"the launch ran past {limit} s and was stopped"), (
            launch.error)
        assert launch.seconds < limit + 20
        groups = {int(line) for line in launch.stdout.split() if line.strip()}
        started |= groups
        if len(groups) == 2:
            break
    assert len(groups) == 2, launch.stdout  # each rank runs in a process group of its own
    for group in started:  # and every one of them is gone
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)


def test_nccl_on_a_torch_without_it_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(scaling.dist, "is_nccl_available", lambda: False)
    start = time.perf_counter()
    launch = scaling.launch(tmp_path / "never.py", 1, {"backend": "nccl"}, tmp_path / "o.json")
    assert launch.returncode is None and time.perf_counter() - start < 1
    assert "is_nccl_available() is False" in launch.error and "gloo" in launch.error


def test_more_nccl_ranks_than_gpus_are_refused(monkeypatch):
    monkeypatch.setattr(scaling.dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(scaling.torch.cuda, "device_count", lambda: 1)
    assert scaling.launch_problem("nccl", 1) == ""
    assert scaling.launch_problem("nccl", 2).startswith("2 ranks of nccl need 2 GPUs")
    assert scaling.launch_problem("gloo", 8) == ""
    assert "not one of" in scaling.launch_problem("mpi", 2)


def test_failure_sentences_from_torchrun_reports():
    report = ("[rank1]: Traceback (most recent call last):\n"
              "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
              "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
              "  exitcode  : 1 (pid: 42)\n")
    said = launcher.failure_sentence(report, 1, who="torchrun")
    assert said.startswith("rank 1 exited with code 1") and "OutOfMemoryError" in said
    killed = "Root Cause (first observed failure):\n  rank      : 0 (local_rank: 0)\n" \
             "  exitcode  : -9 (pid: 7)\n"
    assert launcher.failure_sentence(killed, 1).startswith("rank 0 was killed by signal 9")
    assert "NCCL" in launcher.failure_sentence("RuntimeError: Distributed package doesn't have "
                                               "NCCL built in", 1)
    assert launcher.failure_sentence("", 2, who="torchrun") == "torchrun exited with 2"


def test_a_launch_is_a_torchrun_command_of_the_one_launcher(tmp_path):
    """What a launch runs: torchrun with this Python (helpers.launch.torchrun), the plan and
    the result's path after the script; a refused launch starts nothing."""
    (launch,) = scaling.launch_all([("train.py", 0, {"backend": "gloo"}, tmp_path / "o.json",
                                     29500)], timeout=5)
    assert isinstance(launch, launcher.Result) and launch.nproc == 0
    assert launch.cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--master_port=29500" in launch.cmd and "--nproc_per_node=0" in launch.cmd
    assert launch.cmd[-5:] == [str(Path("train.py").resolve()), "--plan",
                               '{"backend": "gloo"}', "--out", str(tmp_path / "o.json")]
    assert launch.returncode is None and launch.error.startswith("0 ranks cannot start")
    assert launch.summary().startswith("torchrun, 0 rank(s): FAILED: 0 ranks cannot start")


def test_the_script_cell_holds_what_the_chapter_teaches():
    script = notebook_script()
    for piece in ("init_process_group(", "timeout=datetime.timedelta(", "DDP(model",
                  "fully_shard(block, mesh=mesh, mp_policy=mp,",
                  "reshard_after_forward=v.reshard", "gradient_as_bucket_view=v.bucket_view",
                  "fully_shard(model, mesh=mesh, mp_policy=mp)",
                  'torch.device("meta")', "model.to_empty(device=device)",
                  "model.reset_parameters()", "scaling.save_checkpoint(model, optimizer, ckpt)",
                  "scaling.resume(", "scaling.Checkpointed(block)",
                  "MixedPrecisionPolicy(param_dtype=", "scaling.Variant(**record)",
                  "torch.compile(block", "scaling.timing_rounds(", "scaling.fresh_dynamo()",
                  'run.extra["dynamo"] = scaling.counts_since(',
                  'marks.take(f"step {i}: after forward", model)',
                  "reduce_dtype=torch.float32",
                  "init_device_mesh(device.type", "model.no_sync()",
                  "set_requires_gradient_sync(", "AdamW(recipe.param_groups(model), fused=True",
                  'gpt.Recipe(steps=plan["steps"], lr=plan["lr"], warmup=plan["lr_warmup"])',
                  'group["lr"] = recipe.lr_at(i)', "recipe.clip)", "**recipe.hp)",
                  "torch.autocast(", "clip_grad_norm_(", "gpt.BatchPlan.draw(",
                  "dist.all_reduce(losses)", "if rank == 0:",
                  "run_profile.cap_gpu_memory(local_rank)"):
        assert piece in script, piece
    assert ".partition(" not in script, "variants are records in the plan, not parsed names"
    instruments = inspect.getsource(scaling)  # what the script calls, in the chapter module
    for piece in ("dcp.save(state, checkpoint_id=", "dcp.load(state, checkpoint_id=",
                  "get_model_state_dict(model)", "get_optimizer_state_dict(model, optimizer)",
                  "set_model_state_dict(", "set_optimizer_state_dict(", "StateDictOptions(",
                  "use_reentrant=False", "if settled(times):", "torch._dynamo.reset()",
                  '"_has_rebuilt_buckets"', 'torch.compiler.set_stance("force_eager")'):
        assert piece in instruments, piece
    for copy in ("def lr_at", "def param_groups", "math.cos", "weight_decay=0.1", "betas="):
        assert copy not in script, f"the script has its own copy of the recipe: {copy}"


# ------------------------------------------------------------------ the formulas
FORMULA_CELLS = ("# The model in bytes", "# The memory and traffic formulas", "def step_ms(",
                 "ACT_PER_LAYER = ")


def formulas() -> dict:
    """Section 3's and 5's formula cells, executed as the notebook writes them."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    space = {"scaling": scaling, "pd": pd, "display": lambda *a, **k: None,
             "models": {"course GPT": gpt.GPT2_SMALL, "7B-class": scaling.GPT_7B},
             "results": type("R", (), {"save_table": staticmethod(lambda *a, **k: None)}),
             "env": {}}
    for start in FORMULA_CELLS:
        exec(_cell(nb, start), space)
    return space


def test_collective_bytes_by_hand():
    collective_bytes = formulas()["collective_bytes"]
    assert collective_bytes("all-reduce", 100, 4) == 150  # 2 x 3/4 x 100
    assert collective_bytes("reduce-scatter", 100, 4) == 75
    assert collective_bytes("all-gather", 100, 4) == 75
    assert collective_bytes("all-reduce", 100, 1) == 0  # one rank sends nothing


def test_memory_per_gpu_by_hand():
    # 1000 parameters on 4 GPUs: 4 B weights, 4 B grads, 8 B Adam, DDP's 4 B buckets
    f = formulas()
    expect = {"DDP": (4000, 4000, 8000, 4000), "ZeRO-1": (4000, 4000, 2000, 4000),
              "ZeRO-2": (4000, 1000, 2000, 0), "FSDP2 (ZeRO-3)": (1000, 1000, 2000, 0),
              "FSDP2, bf16 gathers": (1000, 1000, 2000, 0)}
    assert set(expect) == set(f["STRATEGIES"])
    for strategy, parts in expect.items():
        got = f["memory_per_gpu"](1000, 4, strategy)
        assert (got["param"], got["grad"], got["adam"], got["buckets"]) == parts, strategy
        assert got["total"] == sum(parts)
    assert f["memory_per_gpu"](1000, 1, "FSDP2 (ZeRO-3)")["total"] == 16000


def test_comm_per_gpu_by_hand():
    # 1000 parameters on 4 GPUs, fp32 (4000 B): an all-reduce sends 6000 B, a gather 3000 B
    comm_per_gpu = formulas()["comm_per_gpu"]
    expect = {"DDP": 6000, "ZeRO-1": 9000, "ZeRO-2": 6000, "FSDP2 (ZeRO-3)": 9000,
              "FSDP2, bf16 gathers": 6000}  # 3/4 x (2000 + 2000 + 4000)
    for strategy, sent in expect.items():
        assert comm_per_gpu(1000, 4, strategy) == pytest.approx(sent), strategy


def test_step_time_weak_and_strong_with_and_without_overlap_by_hand():
    f = formulas()
    step_ms, comm_per_gpu, strategies = f["step_ms"], f["comm_per_gpu"], f["STRATEGIES"]
    # 1e9 bytes at 100 GB/s take 10 ms
    assert step_ms(10.0, 1e9, 100.0, overlap=False) == pytest.approx(20.0)
    assert step_ms(10.0, 1e9, 100.0, overlap=True) == pytest.approx(10.0)
    assert step_ms(4.0, 1e9, 100.0, overlap=True) == pytest.approx(10.0)
    table = scaling.comm_table({"m": gpt.TINY}, {"m": 10.0}, 100.0, comm_per_gpu, step_ms,
                               strategies, gpus=(1, 2))
    one = table[table["gpus"] == 1]
    assert (one["efficiency_no_overlap"] == 1.0).all() and (one["sent_gib"] == 0).all()
    ddp2 = table[(table["gpus"] == 2) & (table["strategy"] == "DDP")].iloc[0]
    sent = 2 * 0.5 * 4 * gpt.count_params(gpt.GPT(gpt.TINY))
    assert ddp2["sent_gib"] == pytest.approx(sent / 2**30) and ddp2["scaling"] == "weak"
    assert ddp2["efficiency_no_overlap"] == pytest.approx(10.0 / (10.0 + sent / 100e9 * 1e3))
    # strong scaling: the same global batch, so each GPU computes half; the bytes are the same
    strong = scaling.comm_table({"m": gpt.TINY}, {"m": 10.0}, 100.0, comm_per_gpu, step_ms,
                                strategies, gpus=(2,), strong=True)
    s2 = strong[strong["strategy"] == "DDP"].iloc[0]
    assert s2["compute_ms"] == 5.0 and s2["sent_gib"] == ddp2["sent_gib"]
    assert s2["efficiency_no_overlap"] == pytest.approx(5.0 / (5.0 + sent / 100e9 * 1e3))
    assert s2["efficiency_no_overlap"] < ddp2["efficiency_no_overlap"]


def test_weak_scaling_is_model_independent_and_strong_scaling_falls_with_n():
    """The sentence the notebook prints: at the same tokens per GPU, bytes and FLOPs both grow
    with the parameters; with a fixed global batch the share sent grows with N."""
    f = formulas()
    models = {"course GPT": gpt.GPT2_SMALL, "7B-class": scaling.GPT_7B}
    compute = {k: 60.0 * gpt.flops_per_token(c) / gpt.flops_per_token(gpt.GPT2_SMALL)
               for k, c in models.items()}
    args = (models, compute, 450.0, f["comm_per_gpu"], f["step_ms"], f["STRATEGIES"])
    weak = scaling.comm_table(*args).query("strategy == 'DDP' and gpus == 8")
    share = weak["comm_ms"] / weak["compute_ms"]
    assert share.max() / share.min() < 1.2  # nearly the same for a 77x larger model
    strong = scaling.comm_table(*args, strong=True).query("strategy == 'DDP'")
    eff = strong[strong["model"] == "course GPT"]["efficiency_no_overlap"].tolist()
    assert eff == sorted(eff, reverse=True) and eff[-1] < weak["efficiency_no_overlap"].min()


def test_activation_memory_by_hand_and_with_checkpointing():
    f = formulas()
    act = f["activation_bytes"]
    cfg = gpt.TINY  # 2 layers x 64, vocabulary 256 (padded)
    head = 4 * 64 + 10 * 256
    assert act(cfg, 100) == 100 * (2 * 38 * 64 + head)
    assert act(cfg, 100, checkpointed=True) == 100 * (2 * 4 * 64 + 38 * 64 + head)
    table = f["act"].set_index(["model", "checkpointing", "strategy", "gpus"])
    big = table.loc[("7B-class", False, "FSDP2 (ZeRO-3)", 8)]
    assert big["activations_gib"] == pytest.approx(
        act(scaling.GPT_7B, 32768) / 2**30) and big["total_gib"] > 141e9 / 2**30
    assert table.loc[("7B-class", True, "FSDP2 (ZeRO-3)", 8), "total_gib"] < 141e9 / 2**30


def test_the_models_on_paper_have_the_parameters_of_their_shapes():
    # by hand: L (12 d^2 + 13 d) + 2 d + (V + T) d
    assert gpt.non_embedding_params(scaling.GPT2_XL) + gpt.embedding_params(scaling.GPT2_XL) \
        == 48 * (12 * 1600**2 + 13 * 1600) + 2 * 1600 + (50304 + 1024) * 1600 == 1_557_686_400
    assert gpt.non_embedding_params(scaling.GPT_7B) + gpt.embedding_params(scaling.GPT_7B) \
        == 6_583_623_680
    with torch.device("meta"):
        assert gpt.count_params(gpt.GPT(scaling.GPT2_XL)) == 1_557_686_400
    f = formulas()
    table = scaling.memory_table({"xl": scaling.GPT2_XL}, f["memory_per_gpu"], f["STRATEGIES"],
                                 gpus=(8,))
    ddp = table[table["strategy"] == "DDP"].iloc[0]
    assert ddp["total_gib"] == pytest.approx(20 * 1_557_686_400 / 2**30)


def test_datasheet_link_is_labelled_and_halved():
    gbps, source = scaling.datasheet_link("NVIDIA H200")
    assert gbps == 450.0 and source.startswith("datasheet value: NVIDIA H200")
    gbps, source = scaling.datasheet_link(None)
    assert gbps == 450.0 and "not this machine's" in source
    assert scaling.datasheet_link("NVIDIA A100-SXM4-80GB")[0] == 300.0
    for pcie in ("NVIDIA H100 PCIe", "NVIDIA A100 80GB PCIe"):  # no SXM NVLink figure for them
        assert "not this machine's" in scaling.datasheet_link(pcie)[1], pcie


def test_compute_time_from_notebook_05_only_when_it_matches(tmp_path):
    from helpers import results

    table = pd.DataFrame([{"path": "3", "status": "ran", "step_ms": 50.0,
                           "tokens_per_s": 32768 / 0.05},
                          {"path": "1b", "status": "not run on this machine"}])
    results.save_table(table, "05_paths", env={"gpu_name": "NVIDIA H200"}, directory=tmp_path)
    saved = json.loads((tmp_path / "05_paths.json").read_text())  # as notebook 07 reads it
    ms, source = scaling.compute_from_05(saved, "NVIDIA H200", 32768, tmp_path / "05_paths.json")
    assert ms == 50.0 and source == (f"notebook 05's path 3, measured on NVIDIA H200 "
                                     f"({tmp_path / '05_paths.json'})")
    assert scaling.compute_from_05(saved, "NVIDIA H200", 16384) is None  # another batch
    assert scaling.compute_from_05(saved, None, 32768) is None  # another device
    assert scaling.compute_from_05(None, "NVIDIA H200", 32768) is None  # 05 did not run here
    not_run = dict(saved, rows=[dict(saved["rows"][0], status="not run on this machine")])
    assert scaling.compute_from_05(not_run, "NVIDIA H200", 32768) is None


def test_compare_and_within():
    def run(losses, norms):
        return bench.Run("r", "cpu", losses=losses,
                         extra={"variant": "v", "world_size": 2, "grad_norms": norms})

    ref = run([5.0, 4.0], [1.0, 2.0])
    row = scaling.compare(ref, run([5.0, 4.00001], [1.0, 2.2]))
    assert row["max_loss_diff"] == pytest.approx(1e-5, rel=1e-3)
    assert row["max_grad_norm_rel_diff"] == pytest.approx(0.1)
    assert math.isnan(row["max_param_diff"]) and not scaling.within(row)
    assert scaling.within(scaling.compare(ref, ref))


# ------------------------------------------------------------------ Apex, mapped
def test_every_pytorch_counterpart_exists_in_this_torch():
    table = scaling.apex_table(None)
    assert table["pytorch_found"].all(), table[~table["pytorch_found"]]
    assert table["apex_checked"].isna().all()
    assert scaling.resolve("torch.nn.SyncBatchNorm.convert_sync_batchnorm") is not None
    assert scaling.resolve("torch.nn.NoSuchThing") is None


@pytest.mark.skipif(not (LEGACY_SRC / "apex" / "parallel").is_dir(),
                    reason="needs the legacy Apex source in .apex_src/legacy/apex")
def test_the_apex_column_holds_in_the_legacy_source(monkeypatch, tmp_path):
    monkeypatch.setenv("APEX_LEGACY_AMP_DIR", str(tmp_path / "no-legacy-install"))
    monkeypatch.setenv("APEX_LEGACY_SRC", str(LEGACY_SRC))
    root, where = scaling.legacy_apex_source()
    assert root == LEGACY_SRC and "APEX_LEGACY_SRC" in where
    table = scaling.apex_table(root)
    assert table["apex_checked"].all(), table[~table["apex_checked"].astype(bool)]
    notes = scaling.deprecation_notes(root)
    assert any("apex.parallel.DistributedDataParallel is deprecated" in n for n in notes)


def test_a_symbol_missing_from_the_source_is_reported(monkeypatch, tmp_path):
    package = tmp_path / "src" / "apex" / "parallel"
    package.mkdir(parents=True)
    (package / "distributed.py").write_text(
        "class DistributedDataParallel:\n    def __init__(self, module, message_size=1):\n"
        "        pass\n")
    monkeypatch.setenv("APEX_LEGACY_AMP_DIR", str(tmp_path / "no-legacy-install"))
    monkeypatch.setenv("APEX_LEGACY_SRC", str(tmp_path / "src"))
    root, _ = scaling.legacy_apex_source()
    table = scaling.apex_table(root).set_index("apex")
    ddp = table.loc["apex.parallel.DistributedDataParallel"]
    assert ddp["apex_checked"] is False or ddp["apex_checked"] == False  # noqa: E712
    assert "lacks" in ddp["apex_evidence"] and "delay_allreduce" in ddp["apex_evidence"]
    assert "is missing" in table.loc["apex.parallel.SyncBatchNorm", "apex_evidence"]


def test_without_a_legacy_source_the_reason_is_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("APEX_LEGACY_AMP_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("APEX_WORKDIR", str(tmp_path / "work"))
    monkeypatch.delenv("APEX_LEGACY_SRC", raising=False)
    root, why = scaling.legacy_apex_source()
    assert root is None and why.startswith("no legacy Apex source here") and "\n" not in why
    assert str(tmp_path / "work" / "src" / "apex-legacy") in why  # every place it looked
    table = scaling.apex_table(root)  # nothing claims a check that did not happen
    assert table["apex_checked"].isna().all()


def test_the_source_build_apex_stages_is_found(monkeypatch, tmp_path):
    """./build_apex.sh --legacy-amp stages the legacy source in $APEX_WORKDIR/src/apex-legacy
    (coursetools/apexbuild/legacy.py) and pip-installs it elsewhere: the map finds the source."""
    staged = tmp_path / "work" / "src" / "apex-legacy"
    (staged / "apex" / "parallel").mkdir(parents=True)
    (staged / "apex" / "parallel" / "distributed.py").write_text("class Reducer:\n    pass\n")
    monkeypatch.setenv("APEX_LEGACY_AMP_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("APEX_WORKDIR", str(tmp_path / "work"))
    monkeypatch.delenv("APEX_LEGACY_SRC", raising=False)
    root, where = scaling.legacy_apex_source()
    assert root == staged and "staged" in where
    table = scaling.apex_table(root).set_index("apex")
    assert bool(table.loc["apex.parallel.Reducer", "apex_checked"])


def test_the_fp16_gradscaler_branch_runs_under_ddp_and_fsdp2(launched):
    """amp_dtype 'fp16' (a GPU below compute capability 8.0): the script's autocast fp16 +
    GradScaler step, run here with CPU autocast on 2 gloo ranks - it trains, finitely, and the
    two wrappers agree; the fp32 run of the same plan and batches (plain, one process) differs
    (autocast was on)."""
    single, _, _, fp16 = launched
    runs = {r.extra["variant"]: r for r in fp16.runs()}
    for run in runs.values():
        assert all(math.isfinite(v) for v in run.losses) and run.losses[-1] < run.losses[0]
    assert max(abs(a - b) for a, b in zip(runs["ddp"].losses, runs["fsdp2"].losses,
                                          strict=True)) < 1e-3
    fp32 = single.runs()[0]
    assert fp32.extra["variant"] == "plain"
    assert max(abs(a - b) for a, b in zip(runs["ddp"].losses, fp32.losses, strict=True)) > 1e-6
    for variant, run in runs.items():  # the scaler was on, and unscaled the grads before clipping
        assert run.extra["loss_scale"] > 1 and fp32.extra["loss_scale"] is None
        norms = zip(run.extra["grad_norms"], fp32.extra["grad_norms"], strict=True)
        worst = max(abs(a - b) / b for a, b in norms)
        assert worst < 0.05, f"{variant}: fp16 gradient norms {worst:.1%} off the fp32 ones"



# ------------------------------------------------------------------ the noise floor
def test_plain_repeated_with_its_seed_is_exact_on_the_cpu_and_another_seed_is_not(launched):
    """The script trains 'plain (repeat 1)' and 'plain (seed 1)' as plain, the second from its
    own seed (other weights, other batches); the CPU repeats the first bit for bit."""
    single = launched[0]
    runs = {r.extra["variant"]: r for r in single.runs()}
    assert list(runs) == ONE_PROCESS + EXTRA
    assert {r.extra["wrapper"] for r in runs.values()} == {"plain", "ddp", "fsdp2"}
    assert runs["plain (repeat 1)"].losses == runs["plain"].losses
    assert runs["plain (repeat 1)"].extra["checksums"] == runs["plain"].extra["checksums"]
    other = runs["plain (seed 1)"]
    assert other.extra["seed"] == 1 and other.losses[0] != runs["plain"].losses[0]
    floor, per_step = scaling.noise_floor(runs)
    assert floor.floor == 0 and per_step == 0 and floor.seed_spread > 0
    assert scaling.params_path(single.out, "plain (repeat 1)").name == "single.plain_repeat_1.pt"
    a, b = single.params("plain"), single.params("plain (repeat 1)")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

def _cell(nb, start: str) -> str:
    found = [c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith(start)]
    assert len(found) == 1, start
    return found[0]


def test_the_one_gpu_cells_read_a_launch_against_its_noise_and_save_07_losses(launched, capsys):
    """Section 4's analysis cells - the overhead table, the loss readings, 07_losses.json and
    the summary's one-GPU lines - run on the one-process CPU launch, which holds the variants
    section 4 launches on a GPU: the code the GPU run takes, run here."""
    from helpers import results, verdicts

    nb = nbformat.read(NOTEBOOK, as_version=4)
    single = launched[0]
    space = {"one_gpu": single, "scaling": scaling, "verdicts": verdicts, "results": results,
             "gpt": gpt, "pd": pd, "gpu_cfg": gpt.TINY, "env": {}, "amp": torch.bfloat16,
             "display": lambda *a, **k: None,
             "losses_record": {"cpu_check": None, "one_gpu": None}}
    exec(_cell(nb, "if one_gpu is not None and one_gpu.ok:\n    runs = "), space)
    overhead = space["overhead"]
    assert list(overhead["variant"]) == ["plain", "ddp", "fsdp2"]  # the repeats are no wrappers
    assert overhead.loc[0, "mem_vs_plain_gib"] == 0 or overhead["mem_vs_plain_gib"].isna().all()
    shown = capsys.readouterr().out  # the cost is read once, from the timing rounds: no verdict
    assert "cannot be told apart" not in shown and "slower than" not in shown, shown
    exec(_cell(nb, "if one_gpu is not None and one_gpu.ok:\n    loss_noise"), space)
    table = space["loss_noise"]
    assert list(table["run"]) == ONE_PROCESS
    rows = table.set_index("run")
    # the wrappers against plain's 2 other seeds; plain's repeat against its same-seed floor
    assert (rows.loc[["ddp", "fsdp2"], "yardstick"] == verdicts.SEEDS).all()
    assert rows.loc["plain (repeat 1)", "yardstick"] == verdicts.REPEAT
    assert rows.loc["ddp", "verdict"] == "within noise" and rows.loc["ddp", "target"] == "within"
    assert (rows.loc[["plain (seed 1)", "plain (seed 2)"], "verdict"] == "yardstick").all()
    floor = space["gpu_floor"]
    assert len(floor.seeds) == 3 and rows.loc["ddp", "yardstick_pct"] == pytest.approx(
        100 * floor.seed_spread)
    # where FSDP2 parts from plain: the CPU repeats every run exactly, so nothing parts
    exec(_cell(nb, "divergence = None\n"), space)
    div = space["divergence"].set_index(["run", "vs"])
    assert (div["first_step_beyond_floor"] == -1).all() and (div["step0_diff"] == 0).all(), div
    assert {("fsdp2", "plain"), ("fsdp2 (repeat 1)", "fsdp2"),
            ("fsdp2+noreshard", "fsdp2")} <= set(div.index)
    assert (div["verdict"] == "within noise").all()
    repeats = [run.startswith(f"{ref} (repeat") for run, ref in div.index]
    assert list(div["yardstick"]) == [verdicts.REPEAT if r else verdicts.SEEDS for r in repeats]
    saved = json.loads((results.results_dir() / "07_losses.json").read_text())
    one = saved["one_gpu"]
    assert set(one["runs"]) == set(ONE_PROCESS + EXTRA)
    assert len(one["runs"]["fsdp2"]["losses"]) == len(one["runs"]["fsdp2"]["grad_norms"]) == 4
    assert one["noise_floor"]["floor"] == 0 and len(one["noise_floor"]["same_seed"]) == 2
    assert len(one["noise_floor"]["other_seeds"]) == 1  # seed 2; seed 1 is other_seed


# ------------------------------------------------------------------ checkpoint, variants, rounds
@pytest.mark.smoke("07")
def test_a_sharded_checkpoint_resumes_with_the_same_losses(smoke_run):
    """07's 2-rank FSDP2 run saved halfway (DCP); a fresh meta-built model loaded it and trained
    the remaining steps: the same losses and weights as the model that kept training."""
    out, _ = smoke_07(smoke_run)
    _, split = check_launches(out)
    at, steps = split.payload["plan"]["checkpoint_at"], split.payload["plan"]["steps"]
    assert 0 < at < steps
    fsdp2 = next(r for r in split.runs() if r.extra["variant"] == "fsdp2")
    resumed = fsdp2.extra["resumed"]
    assert resumed["from_step"] == at and len(resumed["losses"]) == steps - at
    diff = max(abs(a - b) for a, b in zip(fsdp2.losses[at:], resumed["losses"], strict=True))
    assert diff <= scaling.TOLERANCE["max_loss_diff"], diff
    assert resumed["checksums"] == pytest.approx(fsdp2.extra["checksums"], rel=1e-6)
    assert not list(split.out.parent.glob("*.checkpoint")), "the checkpoint was not cleaned up"
    assert "resumed" not in next(r for r in split.runs() if r.extra["variant"] == "ddp").extra


def test_a_missing_checkpoint_load_is_caught(launched):
    """The faulty script never reads the checkpoint: its fresh model's losses are far off."""
    faulty = launched[1]
    at = faulty.payload["plan"]["checkpoint_at"]
    bad = next(r for r in faulty.runs() if r.extra["variant"] == "fsdp2")
    assert bad.extra["resumed"]["from_step"] == at
    off = max(abs(a - b) for a, b in zip(bad.losses[at:], bad.extra["resumed"]["losses"],
                                          strict=True))
    assert off > 100 * scaling.TOLERANCE["max_loss_diff"], off


def _checkpoint_cell(split: scaling.Launch) -> dict:
    """Section 2's checkpoint cell ("Saving and loading a sharded model") on ``split``, the
    name the notebook gives its 2-rank launch."""
    from helpers import results

    nb = nbformat.read(NOTEBOOK, as_version=4)
    space = {"split": split, "pd": pd, "results": results, "env": {},
             "TOLERANCE": scaling.TOLERANCE, "display": lambda *a, **k: None}
    exec(_cell(nb, "kept_on = next("), space)
    return space


@pytest.mark.smoke("07")
def test_the_notebook_reads_the_checkpoint_round_trip(smoke_run, capsys):
    out, _ = smoke_07(smoke_run)
    _, split = check_launches(out)
    space = _checkpoint_cell(split)
    ckpt = space["ckpt"].iloc[0]
    at, steps = split.payload["plan"]["checkpoint_at"], split.payload["plan"]["steps"]
    assert ckpt["within_tolerance"] and ckpt["saved_after_step"] == at
    assert ckpt["steps_after"] == steps - at and ckpt["max_loss_diff"] <= ckpt["tolerance"]
    assert capsys.readouterr().out == ""  # the row is data: the summary reads it


def test_the_checkpoint_cell_stops_on_a_missing_load(launched):
    with pytest.raises(AssertionError):  # the checkpoint cell on the faulty launch stops
        _checkpoint_cell(launched[1])


def test_the_section_4_variants_train_as_plain_does(launched):
    """On the CPU, activation checkpointing, DDP's bucket views and the compiled wrappers change
    nothing in the arithmetic: their losses are plain's (compiled: to rounding); FSDP2's
    bf16 MixedPrecisionPolicy moves them, but not far."""
    runs = {r.extra["variant"]: r for r in launched[0].runs()}
    plain = runs["plain"].losses
    for variant in ("ddp+view", "plain+ac"):
        assert runs[variant].losses == plain, variant
    for variant in ("fsdp2+compile",):
        assert max(abs(a - b) for a, b in zip(runs[variant].losses, plain, strict=True)) < 1e-4
        assert any("_orig_mod" in k for k in runs[variant].extra["checksums"]), variant
    assert any(".block." in k for k in runs["plain+ac"].extra["checksums"])
    mp = max(abs(a - b) for a, b in zip(runs["fsdp2+mp"].losses, plain, strict=True))
    assert 0 < mp < 1e-2
    assert all(r.extra["memory_marks"] == {} for r in runs.values())  # no CUDA: nothing marked


def test_the_timing_rounds_stop_once_settled_and_flag_each_wrapper():
    settled = {"plain": [60.0, 61.0, 60.0, 60.5], "ddp": [70.0, 61.5, 61.0, 61.2]}
    assert not scaling.settled({k: v[:2] for k, v in settled.items()})  # fewer than 3 rounds
    assert scaling.settled(settled)
    row = scaling.rounds_table(settled).iloc[0]
    assert row["settled"] and row["rounds"] == 4 and row["stable"]  # range 15% < 25%
    assert row["verdict"] == "cannot tell apart" and row["label"] == "tie"  # round 1: +16.7%
    drifting = {"plain": [60.0, 62.0, 64.0, 66.0], "ddp": [60.0, 66.0, 72.0, 80.0]}
    assert not scaling.settled(drifting)
    row = scaling.rounds_table(drifting).iloc[0]
    assert not row["settled"] and not row["stable"]
    assert row["verdict"] == "cannot tell apart"  # the first round level with plain's
    assert row["own_drift_pct"] == pytest.approx(100 / 3)
    assert row["baseline_drift_pct"] == pytest.approx(10)


def test_the_section_4_cells_run_on_the_one_process_launch(launched, capsys):
    """The GPU cells of section 4 (rounds, DDP's memory, activation checkpointing, compile,
    MixedPrecisionPolicy) on the CPU launch that holds the same variants: their code runs; the
    memory cell skips in one line where nothing was marked."""
    from helpers import results, verdicts

    nb = nbformat.read(NOTEBOOK, as_version=4)
    single = launched[0]
    rounds = single.payload["rounds"]
    assert set(rounds) == {"plain", "ddp", "fsdp2"} and len(rounds["plain"]) == 2  # unsettled
    runs = {r.extra["variant"]: r for r in single.runs()}
    runs["ddp+compile"] = dataclasses.replace(  # not launched on the CPU: a stand-in
        runs["ddp"], extra={**runs["ddp"].extra, "variant": "ddp+compile"})
    space = {**formulas(), "one_gpu": single, "verdicts": verdicts, "results": results,
             "gpt": gpt, "pd": pd, "gpu_cfg": gpt.TINY, "batch_size": 8, "env": {},
             "display": lambda *a, **k: None, "n_gpu": gpt.count_params(gpt.GPT(gpt.TINY)),
             "runs": runs, "step_floor": 0.0, "gpu_floor": scaling.noise_floor(runs)[0],
             "loss_noise": scaling.noise_table(runs)[0]}
    for start in ("timing_rounds = None\n", "divergence = None\n",
                  "STAGES = ", "if one_gpu is not None and one_gpu.ok:\n    pair = ",
                  "failed = one_gpu.payload.get(", "variants = None\n",
                  "if one_gpu is not None and one_gpu.ok:\n    PAIRS = "):
        exec(_cell(nb, start), space)
    assert capsys.readouterr().out == ""  # the cells show tables, print nothing
    assert space["ddp_growth"] is None  # no CUDA: nothing marked, no memory reading
    assert len(space["timing_rounds"]) == 2
    flags = space["timing_rounds"].set_index("variant")
    assert not flags["settled"].any()  # 2 rounds: none settled; each its own stable flag
    assert all(lb in ("tie", "unstable") or lb.startswith(("faster ", "slower "))
               for lb in flags["label"])
    assert list(space["compiled"]["variant"]) == ["ddp", "ddp+compile", "fsdp2",
                                                  "fsdp2+compile"]
    assert space["ac"]["predicted_saved_gib"].iloc[1] > 0
    # fsdp2+compile compiled on its own after torch._dynamo.reset(): what Dynamo did, counted
    dynamo = runs["fsdp2+compile"].extra["dynamo"]
    assert dynamo["graphs"] >= 1 and dynamo["frames_ok"] >= 1 and dynamo["limit_hits"] == 0
    mixed = space["mixed"].set_index("variant")
    assert mixed.loc["fsdp2+mp", "yardstick"] == verdicts.SEEDS
    assert mixed.loc["fsdp2+mp", "target"] in ("within", "undecided", "beyond")
    # the variants side by side: each against its reference, a label word, Dynamo's counts
    table = space["variants"].set_index("variant")
    assert list(table.index) == ["ddp", "fsdp2", "ddp+view", "fsdp2+noreshard", "plain+ac",
                                 "fsdp2+mp", "ddp+compile", "fsdp2+compile"]
    assert table.loc["plain+ac", "vs"] == "plain" and table.loc["fsdp2+mp", "vs"] == "fsdp2"
    assert all(lb in ("tie", "unstable") or lb.startswith(("faster ", "slower "))
               for lb in table["label"])
    assert table.loc["ddp", "label"] == flags.loc["ddp", "label"]  # the rounds' verdict
    assert table.loc["fsdp2+compile", "graphs"] == dynamo["graphs"]
    assert table.loc["fsdp2+mp", "loss"] == mixed.loc["fsdp2+mp", "verdict"]
    assert table.loc["ddp", "loss"] == "within noise" and table.loc["plain+ac", "loss"] == ""
    assert (results.results_dir() / "07_variants.csv").exists()
    # the summary: numbers and verdict words, one row per finding, computed from these
    space.update(_summary_inputs(space))
    exec(_cell(nb, "summary = ["), space)
    summary = space["summary"].set_index("what")
    rounds = summary.loc["fsdp2 vs plain, step time in rounds (%)"]
    assert rounds["reading"] == flags.loc["fsdp2", "label"]
    assert rounds["value"] == pytest.approx(flags.loc["fsdp2", "overhead_pct"])
    loss = summary.loc["ddp vs plain, val loss (%) vs other seeds' (%)"]
    assert loss["reading"] == "within noise" and loss["against"] == pytest.approx(
        100 * space["gpu_floor"].seed_spread)
    beyond = summary.loc["fsdp2 vs plain, first step beyond the floor (-1: none)"]
    assert beyond["value"] == -1 and beyond["reading"] == "within noise"
    ac = summary.loc["plain+ac: peak GiB saved vs predicted"]
    assert ac["against"] > 0 and ac["reading"] == table.loc["plain+ac", "label"]
    assert summary.loc["several GPUs", "reading"] == "not measured"
    assert len(summary) <= 14 and set(summary["reading"]) <= {
        "within", "beyond", "fits", "does not fit", "predicted", "not predicted", "not measured",
        "checked", "Apex side unchecked", "within noise", "lower", "higher", "tie",
        "unstable", "more later", "nothing more", *table["label"]}


def _summary_inputs(space: dict) -> dict:
    """What the summary cell reads from the sections before it, for a CPU stand-in run: the
    check's and the checkpoint's rows, the memory model, no prediction, no multi-GPU run."""
    check = pd.DataFrame({"max_loss_diff": [1e-7], "within_tolerance": [True]})
    ckpt = pd.DataFrame({"max_loss_diff": [0.0], "within_tolerance": [True]})
    act = pd.DataFrame({"model": "7B-class", "strategy": "FSDP2 (ZeRO-3)", "gpus": 8,
                        "checkpointing": [False, True], "total_gib": [300.0, 90.0]})
    at8 = pd.DataFrame({"model": ["m"], "strategy": ["DDP"], "efficiency_no_overlap": [0.9],
                        "efficiency_overlap": [1.0]}).set_index(["model", "strategy"])
    apex = pd.DataFrame({"pytorch_found": [True, True]})
    return {"check": check, "ckpt": ckpt, "act": act, "at8": at8, "measured_label": "m",
            "predicts": False, "gpu_gib": 139.8, "TOLERANCE": scaling.TOLERANCE,
            "overhead": pd.DataFrame(), "scaled": None, "apex_map": apex, "legacy_root": None,
            "ac": space["ac"]}


def test_the_ddp_memory_cell_reads_a_gpu_runs_marks(capsys):
    """The DDP memory cell on marks as the script records them on a GPU (bytes allocated, peak,
    the .grad tensors' storage, DDP's rebuilt flag), shaped like the H200 run: 0.32 GiB at
    wrapping, 0.32 GiB more from step 1 outside the .grad tensors."""
    from helpers import results

    nb = nbformat.read(NOTEBOOK, as_version=4)
    stages = ["model built", "wrapped", "step 0: after forward", "step 0: after backward",
              "step 0: after the update", "step 1: after forward", "step 1: after backward",
              "step 1: after the update"]
    plain = [0.4, 0.4, 6.0, 0.72, 1.36, 6.0, 0.72, 1.36]
    grads = [0.0, 0.0, 0.0, 0.32, 0.32, 0.0, 0.32, 0.32]
    rebuilt = [False] * 5 + [True] * 3

    def marks(extra, grad_extra, flags, skip=()):
        return {s: [(p + e) * 2**30, (p + e) * 2**30, (g + ge) * 2**30, f]
                for s, p, e, g, ge, f in zip(stages, plain, extra, grads, grad_extra, flags,
                                             strict=True) if s not in skip}

    def run(name, m):
        return bench.Run(name, "cuda", losses=[1.0], extra={"variant": name, "memory_marks": m})

    runs = {"plain": run("plain", marks([0] * 8, [0] * 8, [False] * 8, skip=("wrapped",))),
            "ddp": run("ddp", marks([0, .32, .32, .32, .32, .64, .64, .64], [0] * 8, rebuilt)),
            "ddp+view": run("ddp+view", marks([0, .32, .32, 0, 0, .32, .32, .32],
                                              [0, 0, .32, 0, 0, .32, 0, 0], rebuilt))}
    space = {"runs": runs, "one_gpu": type("L", (), {"ok": True})(), "pd": pd,
             "results": results, "scaling": scaling, "env": {}, "n_gpu": 0.32 * 2**30 / 4,
             "display": lambda *a, **k: None}
    exec(_cell(nb, "STAGES = "), space)
    table = space["ddp_mem"]
    assert list(table["stage"]) == stages
    assert table["ddp_allocated_vs_plain_gib"].tolist() == pytest.approx(
        [0, .32, .32, .32, .32, .64, .64, .64])
    assert table["ddp_grads_vs_plain_gib"].abs().max() < 1e-9
    assert capsys.readouterr().out == ""  # the reading is data: the summary's row
    got = space["ddp_growth"]
    assert got["wrap_gib"] == pytest.approx(0.32) and got["buckets_gib"] == pytest.approx(0.32)
    assert got["grew_at"] == "step 1: after forward" and got["after_rebuild"]
    assert got["more_gib"] == pytest.approx(0.32) and got["in_grads"] is False
    saved = json.loads((results.results_dir() / "07_ddp_memory_growth.json").read_text())
    assert saved["grew_at"] == "step 1: after forward"


def test_the_scaling_plot_cell_reads_every_measured_point_in_one_sentence(capsys):
    """Section 6's plot cell on a made-up table of two GPU counts: one sentence counts the points
    inside their predicted band and names the ones outside."""
    from helpers import results

    nb = nbformat.read(NOTEBOOK, as_version=4)
    rows = [("weak", "ddp", 1, 1.0, 1.0, 1.0), ("weak", "ddp", 2, 0.97, 0.95, 1.0),
            ("strong", "ddp", 2, 0.80, 0.90, 1.0)]
    scaled = pd.DataFrame(rows, columns=["scaling", "variant", "world_size", "efficiency",
                                         "predicted_no_overlap", "predicted_overlap"])
    space = {"scaled": scaled, "batch_size": 8, "gpu_cfg": gpt.TINY, "results": results}
    exec(_cell(nb, 'if scaled is not None and scaled["world_size"].nunique() > 1:'), space)
    said = capsys.readouterr().out
    assert said == ("1 of 2 measured efficiencies lie inside their predicted band; outside it: "
                    "ddp strong on 2 GPUs (80.0%, predicted 90.0% to 100.0%).\n"), said


@pytest.mark.smoke("07")
def test_the_multi_gpu_cell_tabulates_a_launch_and_reads_ddp_against_fsdp2(smoke_run, capsys):
    """Section 6's launch cell with its launches answered by 07's CPU check's 2-rank launch
    (DDP and FSDP2 on the same batches, an all-reduce timed) and its one-process launch as the
    baseline: the table gets its efficiencies and predictions, and one sentence reads DDP
    against FSDP2."""
    import types

    from helpers import results, verdicts

    out, _ = smoke_07(smoke_run)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    single, split = check_launches(out)
    fake = types.SimpleNamespace(**{k: getattr(scaling, k) for k in dir(scaling)
                                    if not k.startswith("__")})
    fake.launch = lambda *a, **k: split
    overhead = scaling.runs_table([r for r in single.runs()
                                   if r.extra["variant"] in ("plain", "ddp", "fsdp2")])
    space = {**formulas(), "scaling": fake, "gpus": 2, "max_gpus": 8, "batch_size": 8,
             "overhead": overhead, "gpu_plan": lambda *a, **k: {}, "script": "train.py",
             "out_dir": Path("."), "launch_timeout_s": 60, "show": lambda launch: None,
             "pd": pd, "verdicts": verdicts, "step_floor": 0.0, "gpu_cfg": gpt.TINY,
             "results": results, "env": {}, "display": lambda *a, **k: None}
    capsys.readouterr()  # what the formula cells printed
    exec(_cell(nb, "counts = [n for n in (2, 4, 8)"), space)
    scaled = space["scaled"]
    assert set(scaled["world_size"]) == {1, 2} and len(scaled) == 8  # 2 one-GPU rows per kind
    two = scaled[scaled["world_size"] == 2]
    assert (two["busbw_gbps"] == split.payload["allreduce"]["busbw_gbps"]).all()
    assert two[["predicted_no_overlap", "predicted_overlap", "efficiency"]].notna().all().all()
    assert two["ddp_vs_fsdp2_nats"].notna().all()
    said = capsys.readouterr().out
    assert said.startswith("DDP and FSDP2 on the same batches: largest per-step loss "
                           "difference over these launches"), said
    assert said.count("\n") == 1


@pytest.mark.smoke("07")
def test_the_smoke_profile_shows_no_predictions_without_a_gpu_step_time(smoke_run):
    """On the CPU no GPU step time is measured: the comm model's cells run their code but show
    no efficiency, no share of the compute time and no 7B step time (one line says so)."""
    _, run = smoke_07(smoke_run)
    if torch.cuda.is_available():
        pytest.skip("a GPU measures a step time here: its predictions are shown")
    nb = nbformat.read(run.output, as_version=4)
    by_id = {c.get("id"): c for c in nb.cells}
    for cell in ("w5c", "c33"):
        assert by_id[cell].outputs == [], by_id[cell].outputs
    shown = by_id["c32"].outputs
    assert all(o.output_type == "stream" for o in shown) and "%" not in "".join(
        o.text for o in shown), shown
