"""Notebook 05's chapter module, and that notebooks 03 and 05 never give opposite eager advice."""

import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from helpers import bench, errors, gpt, kernels, run_profile, verdicts
from helpers.chapters import end_to_end

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "05_end_to_end_transformer.ipynb"


# ------------------------------------------------------------------ memory
def test_saved_bytes_counts_what_autograd_keeps():
    x = torch.randn(8, 16, requires_grad=True)
    assert end_to_end.saved_bytes(lambda: (x * x).exp()) == 2 * 8 * 16 * 4  # x once, exp's out
    with torch.no_grad():
        assert end_to_end.saved_bytes(lambda: (x * x).exp()) == 0
    assert end_to_end.saved_bytes(lambda: torch.nn.Linear(16, 4)(x)) == 8 * 16 * 4  # not w
    norm = torch.nn.LayerNorm(16)  # the FP32 input, plus mean and 1/std per row
    assert end_to_end.saved_bytes(lambda: norm(x)) == 8 * 16 * 4 + 2 * 8 * 4


# ------------------------------------------------------------------ the norm a step pays for
def _timed(gpu, host):
    return {"gpu": gpu, "host": host, "call": [max(g, h) for g, h in zip(gpu, host, strict=True)]}


TIMED = {"torch": _timed([0.30, 0.31, 0.30], [0.42, 0.43, 0.42]),
         "apex": _timed([0.27, 0.28, 0.27], [0.76, 0.70, 0.80]),
         "apex_mixed": _timed([0.27, 0.27, 0.28], [0.54, 0.55, 0.52])}


def test_the_norm_is_picked_by_gpu_time_and_ties_broken_by_the_host():
    choice = end_to_end.norm_choice(TIMED).set_index("norm")
    assert choice.loc["apex", ["gpu_ms", "host_ms", "call_ms"]].tolist() == [0.27, 0.76, 0.76]
    assert choice.loc["apex", "host_range_pct"] == pytest.approx(100 * 0.1 / 0.76)
    assert end_to_end.pick_norm(TIMED, ["apex", "apex_mixed"]) == "apex_mixed"  # GPU: a tie
    slow_gpu = {**TIMED, "apex_mixed": _timed([0.35, 0.36, 0.35], [0.5, 0.5, 0.5])}
    assert end_to_end.pick_norm(slow_gpu, ["apex", "apex_mixed"]) == "apex"


def _run(key, step_ms, *, norm=(), busy=1.0, val=2.0, mem=10.0):
    run = bench.Run(f"path {key}", "cuda", losses=[5.0, 3.0], step_ms=list(step_ms), warmup=0,
                    peak_mem_gib=mem, extra={"val_loss": val})
    if norm:
        run.extra["breakdown"] = {"per_step_ms": {"norm": list(norm)}}
    return run, {"path": key, "kernel_ms": busy * 50.0, "step_ms": 50.0}


def _in_step(busy, ran=True):
    (apex, a), (native, b) = (_run("2", [50] * 4, norm=[7.0, 7.1, 7.0, 7.05], busy=busy),
                              _run("3", [50] * 4, norm=[8.0, 8.1, 8.0, 8.05]))
    answers = verdicts.Answers("05")
    end_to_end.answer_norm_in_step(answers, "In the step?", {"2": apex, "3": native} if ran
                                   else {}, "2", "3", ("apex FusedLayerNorm", "torch LayerNorm"),
                                   pd.DataFrame([a, b] if ran else []))
    return answers.table().iloc[0]


def test_the_norm_in_the_step_is_its_gpu_time_only_where_the_gpu_stayed_busy():
    busy = _in_step(0.99)
    assert busy["verdict"] == "faster" and busy["candidate_value"] == pytest.approx(7.025)
    idle = _in_step(0.80)  # the GPU waited 20% of the step: the host's time per call can decide
    assert idle["verdict"] == verdicts.HOST and "idle 20%" in idle["effect"]
    assert _in_step(0.99, ran=False)["verdict"] == verdicts.MISSING


def test_the_paths_answer_speed_memory_and_loss_apart():
    labels = {"1": "FP32", "2": "Apex", "3": "Native"}
    runs = {"2": _run("2", [49, 50, 51, 50] * 5, mem=9.0, val=2.01)[0],
            "3": _run("3", [59, 60, 61, 60] * 5, mem=10.0, val=2.0)[0]}
    noise = verdicts.NoiseFloor((2.0, 2.0), other_seed=2.02, other_seeds=(1.99,))  # 1.5%
    answers = verdicts.Answers("05")
    for measure in ("time", "memory", "loss"):
        end_to_end.answer_paths(answers, "q?", runs, "2", "3", labels, measure=measure,
                                noise=noise)
    end_to_end.answer_paths(answers, "q?", runs, "2", "1", labels, measure="time")
    table = answers.table()
    assert table["verdict"].tolist() == ["faster", "less", verdicts.SAME, verdicts.MISSING]
    assert table["effect"][2] == "same within 3%"  # twice the other seeds' 1.5% spread
    assert table["candidate"][0] == "path 2: Apex" and "path 1 did not run" in table["basis"][3]
    assert verdicts.check_answers(table) == []
    runs["2"].peak_mem_gib = float("nan")  # the CPU measures no GPU memory
    answers = verdicts.Answers("05")
    end_to_end.answer_paths(answers, "q?", runs, "2", "3", labels, measure="memory")
    assert answers.table()["verdict"].tolist() == [verdicts.MISSING]


# ------------------------------------------------------------------ 03 and 05 give one advice
SHAPE = re.compile(r"fused (\w+) faster than torch's (?:on the GPU |inside .*step )?\((.+)\)\?$")


def opposite_advice(a03: pd.DataFrame, a05: pd.DataFrame) -> list[str]:
    """Keys where 05's in-step answer opposes 03's GPU time (unless 03 says host) or eager call."""
    def opposite(a: str, b: str) -> bool:
        return {a, b} == {"faster", "slower"}

    def by_key(rows: pd.DataFrame) -> dict:
        return {SHAPE.search(q).groups(): v for q, v in zip(rows["question"], rows["verdict"],
                                                             strict=True) if SHAPE.search(q)}

    gpu = by_key(a03[a03["measure"] == "GPU time"])
    call = by_key(a03[a03["measure"] == "time per eager call"])
    step = by_key(a05[a05["measure"] == "norm kernel time per step"])
    return [f"{key}: 05 {v}, 03 GPU {gpu.get(key)}, per call {call.get(key)}"
            for key, v in step.items()
            if (opposite(v, gpu.get(key, "")) and call.get(key) != verdicts.HOST)
            or opposite(v, call.get(key, ""))]


def _advice(step, gpu, call):
    q = "Is Apex's fused LayerNorm faster than torch's {}(fp32->bf16)?"
    a03 = pd.DataFrame({"question": [q.format("on the GPU "), q.format("")],
                        "measure": ["GPU time", "time per eager call"], "verdict": [gpu, call]})
    a05 = pd.DataFrame({"question": [q.format("inside the eager training step ")],
                        "measure": ["norm kernel time per step"], "verdict": [step]})
    return opposite_advice(a03, a05)


@pytest.mark.parametrize("step, gpu, call, opposed", [
    ("faster", "faster", verdicts.HOST, 0),  # 03: depends; 05: what it paid
    ("faster", "slower", verdicts.HOST, 0),  # 03 points at 05 for the step
    ("faster", "faster", "faster", 0), ("faster", "slower", "slower", 1),
    ("slower", "faster", "faster", 1), ("faster", "slower", verdicts.SAME, 1)])
def test_opposite_eager_advice_is_caught(step, gpu, call, opposed):
    assert len(_advice(step, gpu, call)) == opposed


@pytest.mark.notebook
@pytest.mark.smoke("03", "05")
def test_03_and_05_saved_answers_give_one_eager_advice(smoke_run):
    out, runs = smoke_run  # 05's in-step norm answer finds 03's, never pointing the other way
    runs["03_fused_layernorm_rmsnorm.ipynb"], runs["05_end_to_end_transformer.ipynb"]
    a03, a05 = (pd.read_csv(out / "results" / f"{n}_answers.csv") for n in ("03", "05"))
    keys = {q: SHAPE.search(q) for q in (*a03["question"], *a05["question"])}
    step = a05.loc[a05["measure"] == "norm kernel time per step", "question"]
    asked_03 = {keys[q].groups() for q in a03["question"] if keys[q]}
    assert len(step) == 1 and keys[step.iloc[0]].groups() in asked_03  # e.g. LayerNorm fp32->bf16
    assert opposite_advice(a03, a05) == []


@pytest.mark.notebook
@pytest.mark.smoke("05")
def test_05_profiled_steps_fit_their_kernel_time_in_the_traced_step(smoke_run):
    out, runs = smoke_run
    runs["05_end_to_end_transformer.ipynb"]
    b = pd.read_csv(out / "results" / "05_time_breakdown.csv", dtype={"path": str})  # 1 and 3
    assert len(b) == 2 and (b["step_reference"] == "traced").all()
    assert (b["step_ms"] == b["traced_step_ms"]).all() and (b["matmul_ms"] > 0).all()
    assert (b["kernel_ms"] > 0).all() and (b["kernel_ms"] <= b["traced_step_ms"] * 1.05).all()
    ax = end_to_end.breakdown_chart(b)  # a bar per path: its categories and gap, in % of it
    assert sum(p.get_height() for p in ax.patches) == pytest.approx(100 * len(b))
    failed = bench.Run("P2", "cpu", error="out of GPU memory (...)")
    assert end_to_end.breakdown_table({"2": failed}).empty  # a failed path has no row


def test_mfu_limits_accounts_for_the_step_from_the_breakdown():
    cfg, tokens = gpt.GPT2_SMALL, 32768
    att = 6 * cfg.n_layer * cfg.d_model * cfg.seq_len
    table = pd.DataFrame({"path": ["3", "4"], "label": ["native", "compiled"], "status": "ran",
                          "step_ms": [60.0, 50.0], "mfu": [0.3, 0.38]})
    row = {"path": "4", "step_ms": 50.0, "gap_ms": 1.0, "device": "cuda"}  # matmuls 25 ms
    row.update({f"{k}_ms": 4.0 for k in kernels.NAMES if k not in ("matmul", "attention")})
    row.update(matmul_ms=25.0, attention_ms=5.0)
    limits = end_to_end.mfu_limits(pd.DataFrame([row]), table, cfg, tokens, 989.0, 780.0)
    parts = limits.set_index("part")
    assert list(parts.index) == ["parameter matmuls", "attention", "everything else"]
    assert set(limits["path"]) == {"4"}  # the fastest path
    mm_rate = (gpt.flops_per_token(cfg) - att) * tokens / 25e-3 / 1e12
    assert parts.loc["parameter matmuls", "tflops"] == pytest.approx(mm_rate)
    assert parts.loc["parameter matmuls", "vs_burst_ceiling"] == pytest.approx(mm_rate / 780)
    assert parts.loc["attention", "vs_peak"] == pytest.approx(att * tokens / 5e-3 / 1e12 / 989)
    assert parts.loc["everything else", ["ms", "share_of_step"]].tolist() == [20.0, 0.4]
    assert pd.isna(parts.loc["everything else", "tflops"])
    assert end_to_end.mfu_limits(pd.DataFrame(), table, cfg, tokens, 989.0).empty


# ------------------------------------------------------------------ notebook 05's own values
def test_the_05_repeat_counts_follow_the_profile_and_zero_stops_in_one_sentence():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    checks = next(c.source for c in nb.cells if "errors.check_parameters(" in c.source)
    checks = checks.split("print(profile.describe())", 1)[0]
    for profile, repeats, seeds in (("smoke", 1, 1), ("full", 1, 2)):  # None: by the profile
        space = {"errors": errors, "resolve": lambda _n, p=profile: run_profile.Profile(p, "cpu")}
        exec(params + "\n" + checks, space)
        assert (space["noise_runs"], space["seed_runs"]) == (repeats, seeds), profile
    for name in ("noise_runs", "seed_runs"):
        with pytest.raises(errors.CourseError, match=f"^Parameter {name} = 0 must be int >= 1"):
            exec(params.replace(f"{name} = None", f"{name} = 0") + "\n" + checks,
                 {"errors": errors, "resolve": None})
