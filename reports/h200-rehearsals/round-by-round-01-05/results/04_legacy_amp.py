# The legacy apex.amp loop of pre-2025 training scripts. Notebook 04 runs it in a child process
# whose PYTHONPATH puts the legacy install first. Edit it here, then re-run the next cell.
import torch
import torch.nn.functional as F

from helpers import bench
from helpers.chapters import legacy_amp

child = legacy_amp.Child.from_argv()            # the plan: config, levels, eps, device
cfg, device = child.cfg, child.device
batches = legacy_amp.make_batches(cfg, device)  # the notebook's seeded batches


def step_fp32(model, optimizer, x, y):          # section 4's fp32 recipe, line for line
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


with bench.peak_memory(device) as peak:         # 1. fp32: same model, data, seeds?
    model = legacy_amp.make_model(cfg).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    rec = legacy_amp.Recorder(model)
    run = bench.train(lambda i: step_fp32(model, optimizer, *batches[i % cfg.pool]), cfg.steps,
                      device=device, warmup=cfg.warmup_steps, label="torch.amp fp32 (child)",
                      after_step=rec.after_step)
child.runs_append(rec.finish(run, peak, optimizer, api="torch.amp", recipe="fp32"))

amp = child.import_legacy_amp() if child.wants_legacy else None  # 2. the legacy API


def build(opt_level, eps):
    model = legacy_amp.make_model(cfg).to(device)  # an fp32 model on the GPU
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=eps)
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
    return model, optimizer                     # cast, patched or wrapped as the level says


def step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()                  # backward of loss * loss scale
    optimizer.step()                            # skipped by amp after an overflow
    return loss


def loss_scale():
    return amp._amp_state.loss_scalers[0].loss_scale()


for label, opt_level, eps, fused in child.legacy_runs():  # O0-O3, O3 per eps, O1/O2 fused
    model = optimizer = rec = run = None        # free the last run before measuring this one
    with child.level(label, opt_level, eps, fused) as info:  # kernels on/off, reset_amp after
        with bench.peak_memory(device) as peak:
            model, optimizer = build(opt_level, eps)
            options = amp._amp_state.opt_properties.options  # what the level set
            info["options"] = legacy_amp.jsonable_options(options)
            if opt_level == "O1":
                info["patched_functions"] = len(amp._amp_state.handle._all_wrappers)
                info["op_dtypes"] = legacy_amp.op_output_dtypes(device, torch.float16)
            rec = legacy_amp.Recorder(model, loss_scale)
            run = bench.train(lambda i: step(model, optimizer, *batches[i % cfg.pool]),
                              cfg.steps, device=device, warmup=cfg.warmup_steps,
                              label=f"apex.amp {label}", after_step=rec.after_step)
        info["run"] = rec.finish(run, peak, optimizer, api="apex.amp (legacy)", recipe=label)

for opt_level in child.overflow_runs():         # 3. one forced inf gradient per level
    model = optimizer = None
    with child.overflow(opt_level) as row:
        model, optimizer = build(opt_level, cfg.adam_eps)
        row.update(legacy_amp.overflow_probe(lambda x, y: step(model, optimizer, x, y),
                                             model, optimizer, loss_scale, batches))

model = optimizer = None                        # 4. step times in interleaved rounds
child.time_rounds(lambda opt_level: build(opt_level, cfg.adam_eps), step)
child.write()
