"""Run the legacy ``apex.amp`` API (opt levels O0-O3) in a child process and write a JSON result.

Apex removed ``apex.amp`` in 2025, so the course installs the last commit that has it into a
separate folder (``./build_apex.sh --legacy-only``). That folder must never shadow the modern
Apex the other notebooks use, so this module runs as its own process, started by :func:`launch`
with the legacy folder first on ``PYTHONPATH``:

    python -m helpers.legacy_amp_run --out result.json [--config JSON] [--levels O0,O1,O2,O3]
        [--o3-eps 1e-4,1e-3] [--overflow-levels O1,O2] [--torch-recipes fp32] [--dry-run]
        [--allow-compiled]

``--o3-eps`` runs O3 again once per Adam eps given (pure fp16 keeps Adam's state in fp16, where
the default eps of 1e-8 rounds to 0). Each opt level runs in a try block: a level that fails is
reported with its one-line error and the others still run. The child also runs any
``--torch-recipes`` through the same code as the notebook, so a reader can check that the
child reproduces the in-process numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.abc
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from helpers import amp_checks, amp_train, gpu
from helpers.amp_train import Built, RunResult, TrainConfig
from helpers.results import atomic_write_text

OPT_LEVELS = ("O0", "O1", "O2", "O3")
# Compiled modules of a modern Apex build that the legacy Python code would pick up from
# site-packages (amp_C for loss scaling; apex_C and syncbn are imported by apex.parallel).
# Hidden by default: the legacy install is Python-only, and kernels built from another commit
# must not run under its Python code.
COMPILED_APEX_MODULES = ("amp_C", "apex_C", "syncbn")
LEGACY_DIR_VAR = "COURSE_LEGACY_AMP_DIR"


# ------------------------------------------------------------------ the legacy training loop
def build_legacy(opt_level: str, cfg: TrainConfig, device: torch.device) -> Built:
    """The pre-2025 Apex recipe: ``amp.initialize`` then ``amp.scale_loss`` around backward."""
    from apex import amp

    model = amp_train.make_model(cfg).to(device)          # fp32 model on the GPU
    optimizer = amp_train.make_optimizer(model.parameters(), cfg)
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)

    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()                        # backward of loss * loss scale
        optimizer.step()                                  # skipped by amp after an overflow
        return loss

    def loss_scale():
        return amp._amp_state.loss_scalers[0].loss_scale()

    return Built(model, optimizer, step, loss_scale, lambda: list(amp.master_params(optimizer)))


# ------------------------------------------------------------------ amp's global state
def _originals() -> dict[str, object]:
    return {"F.linear": F.linear, "F.softmax": F.softmax, "torch.matmul": torch.matmul,
            "Tensor.__matmul__": torch.Tensor.__matmul__, "Tensor.sum": torch.Tensor.sum}


ORIGINALS = _originals()


def reset_amp() -> bool:
    """Undo what ``amp.initialize`` left in the process (O1's patches of torch functions, the
    loss scalers, the options) so the next opt level starts clean; True when the patched
    functions are the originals again."""
    from apex import amp

    state = amp._amp_state
    handle = getattr(state, "handle", None)
    for mod, name, fn in reversed(getattr(handle, "_all_wrappers", [])):
        if isinstance(mod, dict):
            mod[name] = fn
        else:
            setattr(mod, name, fn)
    if handle is not None:
        handle._all_wrappers = []
        del state.handle
    sys.modules["apex.amp.amp"]._DECORATOR_HANDLE = None
    state.loss_scalers = []
    if hasattr(state, "opt_properties"):
        del state.opt_properties
    return all(_originals()[k] is v for k, v in ORIGINALS.items())


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def first_sentence(text: str) -> str:
    """``text`` up to the end of its first sentence (a '.', '!' or '?' followed by a space or
    the end); the whole text when there is none."""
    match = re.match(r"(.+?[.!?])(?=\s|$)", text.strip())
    return match.group(1) if match else text.strip()


def unavailable(device_is_cuda: bool | None = None) -> str:
    """What the legacy runs need and this machine lacks, as one phrase ('' when they can run).
    Prints nothing (unlike ``gpu.needs``)."""
    if device_is_cuda is None:
        device_is_cuda = gpu.cuda_available()
    if not device_is_cuda:
        return "a CUDA GPU"
    if not gpu.legacy_amp_available():
        return (f"the legacy apex.amp install in {gpu.legacy_amp_dir()} "
                "(run ./build_apex.sh --legacy-only)")
    return ""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _jsonable_options(options: dict) -> dict:
    return {k: (amp_train.dtype_name(v) if isinstance(v, torch.dtype) else v)
            for k, v in options.items()}


class _HideModules(importlib.abc.MetaPathFinder):
    """Makes ``import NAME`` fail for the given top-level names."""

    def __init__(self, names: tuple[str, ...]):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names:
            raise ImportError(f"{fullname} is hidden: the legacy apex.amp runs Python-only")
        return None


def import_legacy_amp(allow_compiled: bool = False) -> dict:
    """Import the legacy ``apex.amp`` and say where it came from; raises on failure."""
    if not allow_compiled:
        sys.meta_path.insert(0, _HideModules(COMPILED_APEX_MODULES))
    import apex
    from apex import amp  # noqa: F401
    from apex.multi_tensor_apply import multi_tensor_applier

    where = str(Path(apex.__file__).resolve().parent)
    legacy_dir = os.environ.get(LEGACY_DIR_VAR)
    if legacy_dir and not where.startswith(str(Path(legacy_dir).resolve()) + os.sep):
        raise ImportError(f"apex was imported from {where}, not from the legacy install "
                          f"{legacy_dir}; put that folder first on PYTHONPATH")
    return {"apex_path": where, "fused_kernels": bool(multi_tensor_applier.available)}


# ------------------------------------------------------------------ one level, one probe
def o3_label(eps: float) -> str:
    """The name of an O3 run with Adam's eps raised to ``eps``, e.g. 'O3 eps=0.001'."""
    return f"O3 eps={eps:g}"


def run_level(opt_level: str, cfg: TrainConfig, batches, label: str | None = None
              ) -> tuple[RunResult, dict]:
    """Train one opt level; returns its result and what apex reported (options, warnings).
    ``label`` names the run when it differs from the opt level (an O3 with another eps)."""
    from apex import amp

    device = batches[0][0].device
    label = label or opt_level
    result = RunResult(f"apex.amp {label}", "apex.amp (legacy)", label, device.type,
                       warmup_steps=cfg.warmup_steps)
    info: dict = {"opt_level": opt_level, "adam_eps": cfg.adam_eps}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with amp_train.peak_memory(device) as mem:
                built = build_legacy(opt_level, cfg, device)
                info["options"] = _jsonable_options(amp._amp_state.opt_properties.options)
                if opt_level == "O1":
                    info["patched_functions"] = len(amp._amp_state.handle._all_wrappers)
                    info["op_dtypes"] = amp_checks.op_output_dtypes(device, torch.float16)
                amp_train.train(built, batches, result, steps=cfg.steps)
            result.peak_mem_mib = mem["mib"]
        except torch.cuda.OutOfMemoryError:
            result.error = amp_train.OOM_MESSAGE
        except Exception as exc:
            result.error = _one_line(exc)
        finally:
            info["restored"] = reset_amp()
    info["warnings"] = sorted({f"{w.category.__name__}: {_first_line(str(w.message))[:500]}"
                               for w in caught})
    return result, info


def overflow_level(opt_level: str, cfg: TrainConfig, batches) -> dict:
    """Force an inf gradient once under ``opt_level`` (see ``amp_checks.overflow_probe``)."""
    row = {"run": f"apex.amp {opt_level}", "api": "apex.amp (legacy)",
           "opt_level_or_recipe": opt_level}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            row.update(amp_checks.overflow_probe(build_legacy(opt_level, cfg,
                                                              batches[0][0].device), batches))
        except Exception as exc:
            row["error"] = _one_line(exc)
        finally:
            reset_amp()
    return row


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _eps_list(text: str) -> list[float]:
    values = [float(t) for t in _csv(text)]
    if not all(0 < v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every eps must be between 0 and 1, got {text}")
    return values


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of the child process."""
    parser = argparse.ArgumentParser(prog="python -m helpers.legacy_amp_run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    parser.add_argument("--config", default=TrainConfig().to_json(), help="TrainConfig as JSON")
    parser.add_argument("--levels", type=_csv, default=[], help="e.g. O0,O1,O2,O3")
    parser.add_argument("--o3-eps", type=_eps_list, default=[],
                        help="run O3 again with each of these Adam eps, e.g. 1e-4,1e-3")
    parser.add_argument("--overflow-levels", type=_csv, default=[], help="e.g. O1,O2")
    parser.add_argument("--torch-recipes", type=_csv, default=[], help="e.g. fp32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dry-run", action="store_true", help="write the plan, train nothing")
    parser.add_argument("--allow-compiled", action="store_true",
                        help=f"let legacy apex use compiled {', '.join(COMPILED_APEX_MODULES)}")
    args = parser.parse_args(argv)
    cfg = TrainConfig.from_json(args.config)
    bad = [lvl for lvl in args.levels + args.overflow_levels if lvl not in OPT_LEVELS]
    bad += [r for r in args.torch_recipes if r not in amp_train.RECIPES]
    if bad:
        parser.error(f"unknown opt level or recipe: {', '.join(bad)}")
    device = torch.device(args.device)
    payload: dict = {
        "meta": {"python": sys.version.split()[0], "torch": torch.__version__,
                 "device": device.type, "config": json.loads(cfg.to_json()),
                 "levels": args.levels, "o3_eps": args.o3_eps,
                 "overflow_levels": args.overflow_levels,
                 "torch_recipes": args.torch_recipes, "dry_run": args.dry_run,
                 "pid": os.getpid()},
        "runs": [], "overflow": [], "levels": {}, "import_error": "",
    }
    start = time.perf_counter()
    if not args.dry_run:
        batches = amp_train.make_batches(cfg, device)
        for name in args.torch_recipes:  # before amp patches anything
            payload["runs"].append(amp_train.run_recipe(
                name, cfg, batches, run=f"torch.amp {name} (child)").to_dict())
        legacy = [(lvl, cfg, lvl) for lvl in args.levels]
        legacy += [("O3", dataclasses.replace(cfg, adam_eps=e), o3_label(e)) for e in args.o3_eps]
        if legacy or args.overflow_levels:
            try:
                if device.type != "cuda":
                    raise RuntimeError("apex.amp needs a CUDA GPU (amp.initialize checks the "
                                       "model is on CUDA)")
                payload["meta"].update(import_legacy_amp(args.allow_compiled))
            except Exception as exc:
                payload["import_error"] = _one_line(exc)
            for level, level_cfg, label in legacy:
                if payload["import_error"]:
                    result = RunResult(f"apex.amp {label}", "apex.amp (legacy)", label,
                                       device.type, error=payload["import_error"])
                    payload["runs"].append(result.to_dict())
                    continue
                result, info = run_level(level, level_cfg, batches, label)
                payload["runs"].append(result.to_dict())
                payload["levels"][label] = info
            for level in args.overflow_levels:
                payload["overflow"].append(
                    {"run": f"apex.amp {level}", "error": payload["import_error"]}
                    if payload["import_error"] else overflow_level(level, cfg, batches))
    payload["meta"]["seconds"] = time.perf_counter() - start
    atomic_write_text(args.out, json.dumps(payload, indent=1) + "\n")
    return 0


# ------------------------------------------------------------------ the parent's side
def launch(cfg: TrainConfig, out: Path | str, *, levels: tuple[str, ...] = (),
           o3_eps: tuple[float, ...] = (), overflow_levels: tuple[str, ...] = (),
           torch_recipes: tuple[str, ...] = (),
           legacy_dir: Path | str | None = None, dry_run: bool = False,
           timeout: float = 600) -> dict:
    """Start the child process and return its JSON payload plus ``returncode``, ``seconds``
    and, when it failed, a one-line ``error``. ``legacy_dir`` goes first on its PYTHONPATH
    (only when legacy levels are asked for), the checkout second so ``helpers`` imports."""
    root = str(Path(__file__).resolve().parent.parent)
    want_legacy = bool(levels or o3_eps or overflow_levels) and legacy_dir is not None
    parts = ([str(legacy_dir)] if want_legacy else []) + [root]
    parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(parts)))
    env.pop(LEGACY_DIR_VAR, None)
    if want_legacy:
        env[LEGACY_DIR_VAR] = str(legacy_dir)
    if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        # On the CPU this process's idle OpenMP threads keep spinning on the same cores for a
        # while; a single-threaded child does not stall on them at its barriers.
        env["OMP_NUM_THREADS"] = "1"
    out = Path(out)
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "helpers.legacy_amp_run", "--out", str(out),
           "--config", cfg.to_json()]
    for flag, values in (("--levels", levels), ("--o3-eps", [repr(e) for e in o3_eps]),
                         ("--overflow-levels", overflow_levels),
                         ("--torch-recipes", torch_recipes)):
        if values:
            cmd += [flag, ",".join(values)]
    if dry_run:
        cmd.append("--dry-run")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"the child process ran past {timeout:.0f} s and was stopped",
                "returncode": None, "seconds": time.perf_counter() - start, "runs": []}
    seconds = time.perf_counter() - start
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    if proc.returncode != 0 or not out.exists():
        return {"error": lines[-1] if lines else f"child exited with {proc.returncode}",
                "returncode": proc.returncode, "seconds": seconds, "runs": [],
                "stderr_tail": lines[-20:]}
    payload = json.loads(out.read_text())
    payload.update(returncode=proc.returncode, seconds=seconds, error="")
    return payload


def runs_of(payload: dict) -> list[RunResult]:
    """The payload's runs as :class:`RunResult` objects."""
    return [RunResult.from_dict(r) for r in payload.get("runs", [])]


if __name__ == "__main__":
    raise SystemExit(main())
