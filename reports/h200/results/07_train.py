# Notebook 07's training script: torchrun starts one copy per rank (one process per GPU, or per
# CPU process with gloo). Each copy reads the plan the notebook passed, trains every variant it
# names on its share of each batch, and rank 0 writes the results as JSON. Edit it here, then
# re-run the launch cells below.
import contextlib
import datetime
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from helpers import bench, errors, gpt, launch, machine, run_profile
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


class Checkpointed(torch.nn.Module):
    """A block that keeps only its input for backward and recomputes the rest there."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)  # activation checkpointing


def mark(name, model):
    """For the DDP memory cell, on a GPU: bytes allocated now and at the peak so far, bytes of
    the storage the .grad tensors live in (each storage once: with gradient_as_bucket_view
    that is DDP's buckets), and whether DDP has rebuilt its buckets (in the order step 0's
    gradients arrived)."""
    grads = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes()
             for g in (p.grad for p in model.parameters())
             if g is not None and not isinstance(g, DTensor)}  # FSDP2's shards: not counted
    if device.type == "cuda":
        marks[name] = [torch.cuda.memory_allocated(device),
                       torch.cuda.max_memory_allocated(device), sum(grads.values()),
                       bool(getattr(model, "_has_rebuilt_buckets", False))]


def build(wrapper, seed, option="", on_meta=False):
    """The same model on every rank, wrapped (DDP) or sharded (FSDP2), and its optimizer.
    `option`: "compile" (each block), "ac" (activation checkpointing), "view" (DDP's grads as
    views into its buckets), "mp" (FSDP2's MixedPrecisionPolicy); `on_meta`: built on the meta
    device, then sharded, then allocated and initialised shard by shard."""
    torch.manual_seed(seed)                   # identical initial weights on every rank
    with torch.device("meta") if on_meta else device:  # meta: shapes only, no memory
        model = gpt.GPT(cfg)
    for k, block in enumerate(model.blocks):
        if option == "ac":
            model.blocks[k] = Checkpointed(block)
        elif option == "compile":             # the blocks share Dynamo's cache; the wrappers'
            model.blocks[k] = torch.compile(block, backend=plan["compile_backend"])  # hooks stay
    mark("model built", model)                # eager (blocks compiled before they are wrapped)
    if wrapper == "ddp":                      # a full copy per rank; grads all-reduced
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                    gradient_as_bucket_view=option == "view")  # view: no second copy of grads
        mark("wrapped", model)
    elif wrapper == "fsdp2":                  # each rank keeps 1/world of every tensor
        mp = MixedPrecisionPolicy(param_dtype=amp or torch.bfloat16,  # gathered and computed
                                  reduce_dtype=torch.float32  # on in bf16; grads reduced in fp32
                                  ) if option == "mp" else MixedPrecisionPolicy()  # default: off
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp)  # one all-gather / reduce-scatter each
        fully_shard(model, mesh=mesh, mp_policy=mp)  # the rest: embeddings, final norm, head
        if on_meta:
            model.to_empty(device=device)     # allocate this rank's shards, uninitialised (the
            # head stays tied here; an unsharded GPT's to_empty unties it: gpt.GPT.tie_weights)
            model.reset_parameters()          # fill them: the whole model is never on one rank
        mark("wrapped", model)
    else:
        assert wrapper == "plain" and world == 1, "plain: one process, no communication"
    optimizer = torch.optim.AdamW(recipe.param_groups(model), fused=True, **recipe.hp)
    return model, optimizer


def save_checkpoint(model, optimizer, path):
    """Every rank writes its own shards of the model and of AdamW's state (DCP)."""
    state = {"model": get_model_state_dict(model),
             "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=path)


def load_checkpoint(model, optimizer, path):
    """Read each rank's shards into a model built the same way (DCP loads in place)."""
    state = {"model": get_model_state_dict(model),
             "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


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
            if i < 2 and k == 0:
                mark(f"step {i}: after forward", model)
            scaler.scale(loss).backward()     # DDP / FSDP2 average the grads over the ranks
        loss_sum += loss.detach()
    if i < 2:
        mark(f"step {i}: after backward", model)
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)  # averaged grads
    grad_norms[i] = norm.full_tensor() if isinstance(norm, DTensor) else norm
    scaler.step(optimizer)
    scaler.update()
    if i < 2:
        mark(f"step {i}: after the update", model)
    return loss_sum                           # this rank's mean loss


results = {"meta": scaling.meta(device), "plan": plan, "runs": [], "failed": {}}
if plan["allreduce_mib"] and world > 1:       # the link, measured: one timed all-reduce
    results["allreduce"] = scaling.time_allreduce(plan["allreduce_mib"], device)
batches = {plan["seed"]: draw(plan["seed"])}
ckpt = out.with_name(out.stem + ".checkpoint")  # this launch's checkpoint folder
at = plan["checkpoint_at"]                    # saved after this many steps (0: none)
for variant in plan["variants"]:              # "plain (repeat 1)", "plain (seed 1)": plain again
    wrapper, _, option = scaling.wrapper_of(variant).partition("+")  # ... with the seed the
    seed = plan.get("seeds", {}).get(variant, plan["seed"])        # plan gives it; "ddp+view"
    if seed not in batches:                   # another seed: other weights and other batches
        batches[seed] = draw(seed)
    model = optimizer = params = None         # free the last variant before measuring this one
    grad_norms = torch.zeros(plan["steps"], device=device)
    marks = {}                                # what mark() records for this variant
    saves = at > 0 and variant == plan["resume"]  # the variant whose checkpoint is reloaded

    def after(i, _):
        if saves and i == at - 1:             # after step `at`, outside the timed window
            save_checkpoint(model, optimizer, ckpt)

    if option == "compile":                   # compiled on its own: Dynamo forgets what an
        torch._dynamo.reset()                 # earlier compiled variant built, then counts
        counted = scaling.dynamo_counts()     # what this one compiles (graphs, recompiles)
    try:
        with bench.peak_memory(device) as peak:
            model, optimizer = build(wrapper, seed, option)
            scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
            run = bench.train(lambda i: train_step(i, model, optimizer, scaler, wrapper,
                                                   grad_norms, batches[seed]),
                              plan["steps"], device=device, warmup=plan["warmup"],
                              label=variant, after_step=after)
    except Exception as exc:                  # a compiled variant that fails to compile here
        if option != "compile" or world > 1:  # is reported, and the launch goes on
            raise
        results["failed"][variant] = errors.one_line(exc)
        print(f"{variant}: failed, {results['failed'][variant]}")
        model = optimizer = None
        continue
    if option == "compile":                   # what Dynamo did for this variant, before the
        run.extra["dynamo"] = scaling.counts_since(counted)  # validation (which runs eager)
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
                                                        device), memory_marks=marks)
    with torch.no_grad(), torch.autocast(device.type, dtype=amp, enabled=amp is not None), \
            torch.compiler.set_stance("force_eager"):  # compiled blocks: no second compile
        # after the bytes held are counted: FSDP2 keeps its root's weights gathered after this
        val_loss = torch.stack([model(xj, yj) for j in range(val_batches.steps)  # in chunks of
                                for xj, yj in zip(*(t.split(micro) for t in val_batches.batch(j)),
                                                  strict=True)])  # `micro`: equal, so the mean
    run.extra["val_loss"] = float(val_loss.mean())  # every rank the same batches: the same loss
    if saves:                                 # a fresh model, on the meta device, other seed:
        marks, norms = {}, torch.zeros_like(grad_norms)  # the load must overwrite every
        model, optimizer = build(wrapper, seed + 1, option, on_meta=True)  # weight and moment
        load_checkpoint(model, optimizer, ckpt)
        resumed = torch.stack([train_step(i, model, optimizer, scaler, wrapper, norms,
                                          batches[seed]) for i in range(at, plan["steps"])])
        dist.all_reduce(resumed)              # the same steps the first model took after `at`
        run.extra["resumed"] = {"from_step": at, "losses": (resumed / world).tolist(),
                                "checksums": scaling.checksums(scaling.full_params(model))}
        dist.barrier()                        # every rank has read its shards: clean up
        if rank == 0:
            shutil.rmtree(ckpt, ignore_errors=True)
    results["runs"].append(run.to_dict())
    if rank == 0:
        if plan["save_params"]:               # the tiny model's weights, for the comparison
            torch.save({k: v.cpu() for k, v in params.items()}, scaling.params_path(out, variant))
        print(f"{variant}, {world} rank(s): {run.timing.median_ms:.1f} ms/step, loss "
              f"{run.losses[0]:.4f} -> {run.losses[-1]:.4f}")
model = optimizer = params = None
marks = {}
if plan["rounds"]:                            # the wrappers timed again, in turn, round after
    kept = {v: build(v, plan["seed"]) for v in ("plain", "ddp", "fsdp2")}  # round, until
    rounds = {v: [] for v in kept}            # their cost settles (or `rounds` have run)
    for _ in range(plan["rounds"]):
        for v, (m, o) in kept.items():
            timed = bench.train(lambda i: train_step(i, m, o, scaler, v, grad_norms,
                                                     batches[plan["seed"]]),
                                plan["round_steps"], device=device, warmup=1, label=v)
            rounds[v].append(timed.timing.median_ms)
        if scaling.settled(rounds):
            break
    results["rounds"] = rounds
if rank == 0:
    launch.write_result(out, results)
dist.destroy_process_group()
