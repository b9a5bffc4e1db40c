"""The headline (coursetools.headline): Apex against native, chosen from a run's tables and
read by the course's rules - never a number of its own."""

import pandas as pd

from coursetools import headline


def _write(results, name, rows):
    pd.DataFrame(rows).to_csv(results / f"{name}.csv", index=False)


def test_the_headline_reads_the_rounds_and_both_norm_rankings(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    _write(results, "02_step_pairs", [
        dict(candidate="apex FusedAdam", vs="fused", candidate_ms=2.1, vs_ms=2.0,
             verdict="cannot tell apart", label="tie")])
    timing = dict(norm="LayerNorm", dtype="bf16", tokens=8, hidden=64)
    _write(results, "03_norm_timings", [
        dict(timing, candidate="apex FusedLayerNorm", median_ms=0.5, q1_ms=0.49, q3_ms=0.51,
             **{"pass": "forward+backward"}),
        dict(timing, candidate="torch LayerNorm", median_ms=0.3, q1_ms=0.29, q3_ms=0.31,
             **{"pass": "forward+backward"})])
    _write(results, "03_rankings", [
        dict(norm="LayerNorm", dtype="bf16", gpu_fastest="torch.compile",
             gpu_verdict="faster 1.30x", call_fastest="torch", call_verdict="faster 1.10x",
             eager_call_fastest="apex Fused", eager_call_verdict="faster 1.20x",
             **{"pass": "forward+backward"})])
    _write(results, "03_call_rounds", [
        dict(norm="LayerNorm", dtype="bf16", candidate="apex FusedLayerNorm", median_ms=0.6,
             **{"pass": "forward+backward"}),
        dict(norm="LayerNorm", dtype="bf16", candidate="torch LayerNorm", median_ms=0.72,
             **{"pass": "forward+backward"})])
    _write(results, "04_speed_pairs", [
        dict(candidate="torch.amp autocast_fp16", vs="apex.amp O1", candidate_ms=3.3,
             vs_ms=4.2, verdict="faster", label="faster 1.27x"),
        dict(candidate="apex.amp O1 fused", vs="apex.amp O1", candidate_ms=3.6, vs_ms=4.2,
             verdict="faster", label="faster 1.17x")])
    table = headline.headline_table(tmp_path).set_index("measure")
    assert table.loc["one step", "reading"].tolist() == ["cannot tell apart", "native faster"]
    # the GPU time says native; what an eager step pays (per call) says Apex: both are shown
    assert table.loc["fwd+bwd, GPU time", "reading"] == "native faster"
    assert table.loc["fwd+bwd, per call", "reading"] == "Apex faster"
    assert table.loc["fwd+bwd, per call", "ratio"] == 0.6 / 0.72
    # Apex against Apex (fused kernels or not) is no Apex-vs-native row
    assert "apex.amp O1 fused" not in set(table["apex"])
    assert "| Apex / native |" in headline.headline_markdown(table.reset_index())
