# Notebook 07's training script, shaped like nanoGPT's train.py: torchrun starts one copy per
# rank; each reads the plan, trains every variant it names on its share of each batch, and rank 0
# writes the results as JSON. What only measures (memory marks, Dynamo's counts, the checkpoint
# resume, timing rounds) is in helpers/chapters/scaling.py. Edit here, then re-run the launches.
import contextlib
import dataclasses
import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import bench, errors, gpt, launch, run_profile
from helpers.chapters import scaling

# --- 1. this rank's place: torchrun sets RANK (0..N-1), LOCAL_RANK (its GPU), WORLD_SIZE (N)
plan, out = launch.read_plan()                # --plan JSON --out PATH, from the notebook
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
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
marks = scaling.MemoryMarks(device)           # bytes at each stage, on a GPU (section 4)


def draw(seed):
    """Every step's batch, drawn from `seed`: the same on every rank."""
    return gpt.BatchPlan.draw(corpus, steps=plan["steps"], batch=plan["global_batch"],
                              seq_len=cfg.seq_len, seed=seed).to(device)


# --- 2. build: the same model on every rank, wrapped (DDP) or sharded (FSDP2)
def build(v, on_meta=False):
    """Variant `v`'s model and optimizer (v: a scaling.Variant record from the plan); `on_meta`:
    built on the meta device, sharded, then allocated and initialised shard by shard."""
    torch.manual_seed(v.seed)                 # identical initial weights on every rank
    with torch.device("meta") if on_meta else device:  # meta: shapes only, no memory
        model = gpt.GPT(cfg)
    for k, block in enumerate(model.blocks):
        if v.ac:                              # keep each block's input, recompute the rest
            model.blocks[k] = scaling.Checkpointed(block)
        elif v.compile:                       # blocks compiled before they are wrapped: they
            model.blocks[k] = torch.compile(block, backend=plan["compile_backend"])  # share
    marks.take("model built", model)          # Dynamo's cache; DDP's and FSDP2's hooks stay eager
    if v.wrapper == "ddp":                    # a full copy per rank; grads all-reduced
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                    gradient_as_bucket_view=v.bucket_view)  # True: no second copy of grads
        marks.take("wrapped", model)
    elif v.wrapper == "fsdp2":                # each rank keeps 1/world of every tensor
        mp = MixedPrecisionPolicy(param_dtype=amp or torch.bfloat16,  # gathered and computed
                                  reduce_dtype=torch.float32  # on in bf16; grads reduced in fp32
                                  ) if v.mp else MixedPrecisionPolicy()  # default: off
        for block in model.blocks:            # one all-gather / reduce-scatter each;
            fully_shard(block, mesh=mesh, mp_policy=mp,  # False: no second gather in backward
                        reshard_after_forward=v.reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp)  # the rest: embeddings, final norm, head
        if on_meta:
            model.to_empty(device=device)     # allocate this rank's shards, uninitialised (the
            # head stays tied here; an unsharded GPT's to_empty unties it: gpt.GPT.tie_weights)
            model.reset_parameters()          # fill them: the whole model is never on one rank
        marks.take("wrapped", model)
    else:
        assert v.wrapper == "plain" and world == 1, "plain: one process, no communication"
    optimizer = torch.optim.AdamW(recipe.param_groups(model), fused=True, **recipe.hp)
    return model, optimizer


# --- 3. the step: notebook 05's, on this rank's share of batch i, in `accum` micro-batches
def train_step(i, model, optimizer, scaler, wrapper, grad_norms, batches):
    """One optimizer step; returns this rank's mean loss."""
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
            if i < 2 and k == 0:
                marks.take(f"step {i}: after forward", model)
            scaler.scale(loss).backward()     # DDP / FSDP2 average the grads over the ranks
        loss_sum += loss.detach()
    if i < 2:
        marks.take(f"step {i}: after backward", model)
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)  # averaged grads
    grad_norms[i] = norm.full_tensor() if isinstance(norm, DTensor) else norm
    scaler.step(optimizer)
    scaler.update()
    if i < 2:
        marks.take(f"step {i}: after the update", model)
    return loss_sum


# --- 4. the loop: every variant of the plan in turn, each from its own seed
results = {"meta": scaling.meta(device), "plan": plan, "runs": [], "failed": {}}
if plan["allreduce_mib"] and world > 1:       # the link, measured: one timed all-reduce
    results["allreduce"] = scaling.time_allreduce(plan["allreduce_mib"], device)
batches = {plan["seed"]: draw(plan["seed"])}
ckpt = out.with_name(out.stem + ".checkpoint")  # this launch's checkpoint folder
at = plan["checkpoint_at"]                    # saved after this many steps (0: none)
for v in (scaling.Variant(**record) for record in plan["variants"]):
    if v.seed not in batches:                 # another seed: other weights and other batches
        batches[v.seed] = draw(v.seed)
    model = optimizer = params = None         # free the last variant before measuring this one
    grad_norms = torch.zeros(plan["steps"], device=device)
    marks = scaling.MemoryMarks(device)       # this variant's memory stages
    saves = at > 0 and v.name == plan["resume"]  # the variant whose checkpoint is reloaded

    def after(i, _):
        if saves and i == at - 1:             # after step `at`, outside the timed window
            scaling.save_checkpoint(model, optimizer, ckpt)  # DCP: every rank its own shards

    counted = scaling.fresh_dynamo() if v.compile else None  # each compiled variant on its own
    try:
        with bench.peak_memory(device) as peak:
            model, optimizer = build(v)
            scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
            run = bench.train(lambda i: train_step(i, model, optimizer, scaler, v.wrapper,
                                                   grad_norms, batches[v.seed]),
                              plan["steps"], device=device, warmup=plan["warmup"],
                              label=v.name, after_step=after)
    except Exception as exc:                  # a compiled variant that fails to compile here
        if not v.compile or world > 1:        # is reported, and the launch goes on
            raise
        results["failed"][v.name] = errors.one_line(exc)
        print(f"{v.name}: failed, {results['failed'][v.name]}")
        model = optimizer = None
        continue
    if v.compile:                             # before the validation (which runs eager)
        run.extra["dynamo"] = scaling.counts_since(counted)
    losses = torch.tensor(run.losses, device=device)
    dist.all_reduce(losses)                   # the sum of the ranks' mean losses; / world is
    run.losses = (losses / world).tolist()    # the whole batch's mean (equal shares)
    params = scaling.full_params(model)       # FSDP2 gathers its shards: every rank calls it
    run.peak_mem_gib = scaling.max_over_ranks({"peak": peak.gib}, device)["peak"]
    run.extra.update(variant=v.name, wrapper=v.wrapper, seed=v.seed, world_size=world,
                     accum=accum, tokens_per_step=plan["global_batch"] * cfg.seq_len,
                     grad_norms=grad_norms.tolist(), checksums=scaling.checksums(params),
                     loss_scale=scaler.get_scale() if scaler.is_enabled() else None,
                     state_bytes=scaling.max_over_ranks(scaling.state_bytes(model, optimizer),
                                                        device), memory_marks=marks.taken)
    run.extra["val_loss"] = scaling.val_loss(model, val_batches, micro, amp, device)
    if saves:                                 # a fresh model, on the meta device, other seed:
        marks, norms = scaling.MemoryMarks(device), torch.zeros_like(grad_norms)  # the load
        run.extra["resumed"] = scaling.resume(  # must overwrite every weight and moment
            lambda: build(dataclasses.replace(v, seed=v.seed + 1), on_meta=True),
            lambda i, m, o: train_step(i, m, o, scaler, v.wrapper, norms, batches[v.seed]),
            ckpt, at, plan["steps"])
    results["runs"].append(run.to_dict())
    if rank == 0:
        if plan["save_params"]:               # the tiny model's weights, for the comparison
            torch.save({k: t.cpu() for k, t in params.items()}, scaling.params_path(out, v.name))
        print(f"{v.name}, {world} rank(s): {run.timing.median_ms:.1f} ms/step, loss "
              f"{run.losses[0]:.4f} -> {run.losses[-1]:.4f}")
model = optimizer = params = None
marks = scaling.MemoryMarks(device)           # the rounds' marks are not kept
if plan["rounds"]:                            # the wrappers timed again, in turn, round after
    kept = {w: build(scaling.Variant(w, w, plan["seed"])) for w in ("plain", "ddp", "fsdp2")}
    results["rounds"] = scaling.timing_rounds(  # round, until their cost settles
        {w: (lambda i, m=m, o=o, w=w: train_step(i, m, o, scaler, w, grad_norms,
                                                 batches[plan["seed"]]))
         for w, (m, o) in kept.items()}, plan["rounds"], plan["round_steps"], device)
if rank == 0:
    launch.write_result(out, results)
dist.destroy_process_group()
