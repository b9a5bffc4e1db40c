"""Choose the course's training recipe by measurement: peak learning rate x warm-up length.

Trains notebook 05's GPT (the full profile's shape, batch and step budget) with notebook 05's
path 3 (``nn.LayerNorm``, ``AdamW(fused=True)``, bf16 autocast, the same batches and initial
weights) once per pair of the grid, and each pair a second time with the same seed, so every
row carries its own run-to-run noise. It writes one row per pair: the loss of step 0, the
highest loss after it (a healthy start never climbs above step 0), the largest gradient norm
of the first ten steps, the final training and validation losses, and the same-seed repeat's
validation loss.

Then, on the chosen pair (the lowest validation loss among the pairs whose start is healthy),
the noise studies the notebooks read their verdicts against: another seed, path 1b (FP32 with
TF32 matmuls), and, with ``--extras``, the same run under deterministic algorithms.

Run once on a GPU (about four minutes on an H200)::

    python -m coursetools.recipe_sweep --out reports/recipe

``--smoke`` runs a tiny grid on the tiny model (seconds on a CPU), for the tests.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from helpers import bench, gpt

FULL_LRS = (3e-4, 6e-4, 1e-3, 1.5e-3)
FULL_WARMUPS = (10, 20, 40, 60)


def one_run(*, cfg, data, batch, steps, lr, warmup, seed, device, amp=torch.bfloat16,
            tf32=False, deterministic=False, wrap=None) -> dict:
    """Notebook 05's path 3 (or 1b with ``amp=None, tf32=True``) for ``steps`` steps."""
    recipe = gpt.Recipe(steps=steps, lr=lr, warmup=warmup)
    torch.manual_seed(seed)
    init = gpt.GPT(cfg).state_dict()
    with device:
        model = gpt.GPT(cfg, norm=nn.LayerNorm, attention="sdpa")
    model.load_state_dict(init)
    if wrap == "ddp":  # notebook 07's wrappers at world size 1: the same maths as plain
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    plan = gpt.BatchPlan.draw(data.train, steps=steps, batch=batch, seq_len=cfg.seq_len,
                              seed=seed).to(device)
    val_plan = gpt.BatchPlan.draw(data.val, steps=8, batch=batch, seq_len=cfg.seq_len,
                                  seed=1000).to(device)  # the same validation batches for all
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(recipe.param_groups(model), fused=fused, **recipe.hp)
    norms = torch.zeros(steps, device=device)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.use_deterministic_algorithms(deterministic, warn_only=True)

    def step(i):
        x, y = plan.batch(i)
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr_at(i)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        norms[i] = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    run = bench.train(step, steps, device=device, warmup=min(5, steps - 1))
    with torch.no_grad(), torch.autocast(device.type, dtype=amp or torch.float32,
                                         enabled=amp is not None):
        val = float(torch.stack([model(*val_plan.batch(i)) for i in range(val_plan.steps)])
                    .mean())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(False)
    losses, grad = run.losses, norms.tolist()
    return {"lr": lr, "warmup": warmup, "seed": seed, "step0_loss": losses[0],
            "max_loss_after_step0": max(losses[1:]),
            "worst_step": 1 + max(range(len(losses) - 1), key=lambda k: losses[k + 1]),
            "max_grad_norm_first10": max(grad[:10]), "final_train_loss": run.final_loss,
            "val_loss": val, "step_ms": run.timing.median_ms, "losses": losses,
            "grad_norms": grad}


def main(argv: list[str] | None = None) -> int:
    """Run the grid and the noise studies; write recipe_sweep.csv and recipe_sweep.json."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the CSV and JSON")
    ap.add_argument("--smoke", action="store_true", help="tiny model and grid (a CPU test)")
    ap.add_argument("--extras", action="store_true", help="also the deterministic-mode runs")
    ap.add_argument("--studies", nargs=2, type=float, metavar=("LR", "WARMUP"),
                    help="skip the grid: only the noise studies, at this pair")
    args = ap.parse_args(argv)
    import pandas as pd

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke:
        cfg, batch, steps, lrs, warmups = gpt.TINY, 4, 12, (1e-3, 3e-3), (2, 4)
        data = gpt.load_corpus(cap_mb=1)
    else:
        if device.type != "cuda":
            print("recipe_sweep: the full grid needs a CUDA GPU; --smoke runs on the CPU")
            return 2
        cfg, batch, steps, lrs, warmups = gpt.GPT2_SMALL, gpt.FULL_BATCH, 80, FULL_LRS, \
            FULL_WARMUPS
        data = gpt.load_corpus(cap_mb=16)
    args.out.mkdir(parents=True, exist_ok=True)
    common = dict(cfg=cfg, data=data, batch=batch, steps=steps, device=device)
    rows, started = [], time.perf_counter()
    grid = [] if args.studies else list(itertools.product(lrs, warmups))
    for lr, warmup in grid:
        first = one_run(lr=lr, warmup=warmup, seed=0, **common)
        again = one_run(lr=lr, warmup=warmup, seed=0, **common)
        first["val_loss_repeat"] = again["val_loss"]
        first["same_seed_spread_pct"] = 100 * abs(again["val_loss"] / first["val_loss"] - 1)
        first["healthy"] = first["max_loss_after_step0"] < first["step0_loss"]
        rows.append(first)
        print(f"lr {lr:g} warm-up {warmup:3d}: step 0 {first['step0_loss']:.3f}, worst later "
              f"{first['max_loss_after_step0']:.3f} (step {first['worst_step']}), grad norm "
              f"<= {first['max_grad_norm_first10']:.1f} in 10 steps, val {first['val_loss']:.4f}"
              f" / again {again['val_loss']:.4f} ({first['same_seed_spread_pct']:.3f}%)",
              flush=True)
    table = pd.DataFrame([{k: v for k, v in r.items() if not isinstance(v, list)} for r in rows])
    stem = "recipe_studies" if args.studies else "recipe_sweep"
    if not args.studies:  # written before the studies, so a failure there keeps the grid
        table.to_csv(args.out / f"{stem}.csv", index=False)
    if args.studies:
        chosen = dict(lr=args.studies[0], warmup=int(args.studies[1]))
    else:
        healthy = table[table["healthy"]]
        pick = (healthy if len(healthy) else table).sort_values("val_loss").iloc[0]
        chosen = dict(lr=float(pick["lr"]), warmup=int(pick["warmup"]))
        print(f"chosen: lr {chosen['lr']:g}, warm-up {chosen['warmup']} "
              f"({'healthy' if len(healthy) else 'NO pair had a healthy start'})", flush=True)
    studies = {f"seed 0 run {k}": one_run(seed=0, **chosen, **common) for k in (1, 2, 3)}
    studies.update({f"seed {k}": one_run(seed=k, **chosen, **common) for k in (1, 2)})
    if device.type == "cuda":
        studies["path 1b (fp32 + tf32)"] = one_run(seed=0, amp=None, tf32=True, **chosen,
                                                   **common)
    if args.extras and device.type == "cuda":
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        short = dict(common, steps=30)  # notebook 07's one-GPU runs: 30 steps
        warm = round(chosen["warmup"] * 30 / steps)
        for wrap in ("plain", "plain", "plain", "ddp", "fsdp2"):
            name = f"{wrap} (world size 1, 30 steps)"
            name += f" {sum(k.startswith(name) for k in studies) + 1}"
            studies[name] = one_run(seed=0, wrap=wrap, lr=chosen["lr"], warmup=warm, **short)
        dist.destroy_process_group()
    if args.extras:
        for k in (1, 2):
            studies[f"deterministic {k}"] = one_run(seed=0, deterministic=True, **chosen,
                                                    **common)
    base = studies["seed 0 run 1"]["val_loss"]
    for name, r in studies.items():
        print(f"{name}: val {r['val_loss']:.4f} ({100 * (r['val_loss'] / base - 1):+.3f}% vs "
              f"seed 0), step 0 {r['step0_loss']:.3f}, worst later {r['max_loss_after_step0']:.3f}"
              f", {r['step_ms']:.1f} ms/step", flush=True)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "cfg": cfg.__dict__, "batch": batch, "steps": steps,
            "chosen": chosen, "wall_s": time.perf_counter() - started,
            "course_commit": os.environ.get("COURSE_COMMIT", "")}
    with open(args.out / f"{stem}.json", "w") as f:
        json.dump({"meta": meta, "grid": rows, "studies": studies}, f)
    print(f"wrote {args.out / stem}.* in {meta['wall_s']:.0f} s")
    return 0 if math.isfinite(base) else 1


if __name__ == "__main__":
    sys.exit(main())
