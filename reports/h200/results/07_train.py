# Notebook 07's training script: torchrun starts one copy per rank (one process per GPU, or per
# CPU process with gloo). Each copy reads the plan the notebook passed, trains every variant it
# names on its share of each batch, and rank 0 writes the results as JSON. Edit it here, then
# re-run the launch cells below.
import contextlib
import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import bench, gpt, launch, machine, run_profile
from helpers.chapters import scaling

plan, out = launch.read_plan()                # --plan JSON --out PATH, from the notebook
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # set by torchrun
local_rank = int(os.environ["LOCAL_RANK"])    # this rank's GPU on this machine
if plan["backend"] == "nccl":
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)             # one GPU per rank, before any CUDA work
    cap = run_profile.cap_gpu_memory(local_rank)  # COURSE_GPU_MEMORY_GIB holds in every rank too
    if cap and rank == 0:
        print(cap)
else:
    device = torch.device("cpu")
dist.init_process_group(plan["backend"], device_id=device if device.type == "cuda" else None,
                        timeout=datetime.timedelta(seconds=plan["timeout_s"]))  # per collective
mesh = init_device_mesh(device.type, (world,))  # FSDP2's ranks, on this run's device

cfg = gpt.GPTConfig(**plan["cfg"])
amp = getattr(torch, plan["amp"]) if plan["amp"] else None  # autocast dtype; None: fp32
accum = plan["accum"]                         # micro-batches per rank and optimizer step
per_rank = plan["global_batch"] // world      # this rank's share of every step's batch
micro = per_rank // accum                     # sequences per forward/backward
assert per_rank * world == plan["global_batch"] and micro * accum == per_rank, (
    f"a batch of {plan['global_batch']} sequences does not split into {world} ranks x {accum} "
    "micro-batches of equal size: choose a batch that is a multiple of their product")
corpus = torch.load(plan["corpus"])           # notebook 05's training bytes (uint8)
val_batches = gpt.BatchPlan.draw(torch.load(plan["val_corpus"]), steps=plan["val_batches"],
                                 batch=plan["global_batch"], seq_len=cfg.seq_len,
                                 seed=plan["seed"] + 1).to(device)  # held out, the same for all
# the course's recipe (gpt.Recipe): AdamW's settings, warm-up and cosine decay, clipping
recipe = gpt.Recipe(steps=plan["steps"], lr=plan["lr"], warmup=plan["lr_warmup"])


def draw(seed):
    """Every step's batch, drawn from `seed`: the same on every rank."""
    return gpt.BatchPlan.draw(corpus, steps=plan["steps"], batch=plan["global_batch"],
                              seq_len=cfg.seq_len, seed=seed).to(device)


def build(wrapper, seed):
    """The same model on every rank, wrapped (DDP) or sharded (FSDP2), and its optimizer."""
    torch.manual_seed(seed)                   # identical initial weights on every rank
    with device:
        model = gpt.GPT(cfg)
    if wrapper == "ddp":                      # a full copy per rank; grads all-reduced
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    elif wrapper == "fsdp2":                  # each rank keeps 1/world of every tensor
        for block in model.blocks:
            fully_shard(block, mesh=mesh)     # one all-gather / reduce-scatter per block
        fully_shard(model, mesh=mesh)         # the rest: embeddings, final norm, tied head
    else:
        assert wrapper == "plain" and world == 1, "plain: one process, no communication"
    optimizer = torch.optim.AdamW(recipe.param_groups(model), fused=True, **recipe.hp)
    return model, optimizer


def train_step(i, model, optimizer, scaler, wrapper, grad_norms, batches):
    """Notebook 05's step on this rank's share of batch i, in `accum` micro-batches."""
    optimizer.zero_grad(set_to_none=True)
    for group in optimizer.param_groups:
        group["lr"] = recipe.lr_at(i)
    x, y = batches.batch(i)                   # batch i, the same on every rank ...
    x, y = (t[rank * per_rank:(rank + 1) * per_rank] for t in (x, y))  # ... rank r's slice
    loss_sum = torch.zeros((), device=device)
    for k, (xk, yk) in enumerate(zip(x.split(micro), y.split(micro), strict=True)):
        sync = k == accum - 1                 # communicate after the last micro-batch only
        if wrapper == "fsdp2":
            model.set_requires_gradient_sync(sync)  # False: keep grads local, no reduce-scatter
        skip = model.no_sync() if wrapper == "ddp" and not sync else contextlib.nullcontext()
        with skip:                            # DDP inside no_sync(): no all-reduce
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                loss = model(xk, yk) / accum  # mean over this rank's share of the batch
            scaler.scale(loss).backward()     # DDP / FSDP2 average the grads over the ranks
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)  # averaged grads
    grad_norms[i] = norm.full_tensor() if isinstance(norm, DTensor) else norm
    scaler.step(optimizer)
    scaler.update()
    return loss_sum                           # this rank's mean loss


results = {"meta": scaling.meta(device), "plan": plan, "runs": []}
if plan["allreduce_mib"] and world > 1:       # the link, measured: one timed all-reduce
    results["allreduce"] = scaling.time_allreduce(plan["allreduce_mib"], device)
batches = {plan["seed"]: draw(plan["seed"])}
for variant in plan["variants"]:              # "plain (repeat 1)", "plain (seed 1)": plain again
    wrapper = scaling.wrapper_of(variant)     # ... with the seed the plan gives it
    seed = plan.get("seeds", {}).get(variant, plan["seed"])
    if seed not in batches:                   # another seed: other weights and other batches
        batches[seed] = draw(seed)
    model = optimizer = params = None         # free the last variant before measuring this one
    grad_norms = torch.zeros(plan["steps"], device=device)
    with bench.peak_memory(device) as peak:
        model, optimizer = build(wrapper, seed)
        scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
        run = bench.train(lambda i: train_step(i, model, optimizer, scaler, wrapper, grad_norms,
                                               batches[seed]),
                          plan["steps"], device=device, warmup=plan["warmup"], label=variant)
    losses = torch.tensor(run.losses, device=device)
    dist.all_reduce(losses)                   # the sum of the ranks' mean losses; / world is
    run.losses = (losses / world).tolist()    # the whole batch's mean (equal shares)
    params = scaling.full_params(model)       # FSDP2 gathers its shards: every rank calls it
    run.peak_mem_gib = scaling.max_over_ranks({"peak": peak.gib}, device)["peak"]
    run.extra.update(variant=variant, wrapper=wrapper, seed=seed, world_size=world,
                     accum=accum, tokens_per_step=plan["global_batch"] * cfg.seq_len,
                     grad_norms=grad_norms.tolist(), checksums=scaling.checksums(params),
                     loss_scale=scaler.get_scale() if scaler.is_enabled() else None,
                     state_bytes=scaling.max_over_ranks(scaling.state_bytes(model, optimizer),
                                                        device))
    with torch.no_grad(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        # after the bytes held are counted: FSDP2 keeps its root's weights gathered after this
        val_loss = torch.stack([model(xj, yj) for j in range(val_batches.steps)  # in chunks of
                                for xj, yj in zip(*(t.split(micro) for t in val_batches.batch(j)),
                                                  strict=True)])  # `micro`: equal, so the mean
    run.extra["val_loss"] = float(val_loss.mean())  # every rank the same batches: the same loss
    results["runs"].append(run.to_dict())
    if rank == 0:
        if plan["save_params"]:               # the tiny model's weights, for the comparison
            torch.save({k: v.cpu() for k, v in params.items()}, scaling.params_path(out, variant))
        print(f"{variant}, {world} rank(s): {run.timing.median_ms:.1f} ms/step, loss "
              f"{run.losses[0]:.4f} -> {run.losses[-1]:.4f}")
if rank == 0:
    launch.write_result(out, results)
dist.destroy_process_group()
