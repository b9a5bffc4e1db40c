# build_apex.sh environment probe
import os, shutil, sys, sysconfig
def out(key, value):
    print(f"{key}={str(value).replace(chr(10), ' ').strip()}")
out("python_version", sys.version.split()[0])
out("site_packages", sysconfig.get_paths().get("purelib", "?"))
try:
    import pip
    out("pip_version", pip.__version__)
except Exception:
    out("pip_version", "none")
ninja_bin = shutil.which("ninja") or ""
try:
    import ninja
    bin_dir = getattr(ninja, "BIN_DIR", os.path.join(os.path.dirname(ninja.__file__), "data", "bin"))
    ninja_bin = ninja_bin or os.path.join(bin_dir, "ninja")
    has_ninja = True
except Exception:
    has_ninja = bool(ninja_bin)
out("ninja", "yes" if has_ninja else "no")
out("ninja_bin", ninja_bin)
import importlib.util
out("build_deps_missing", ",".join(m for m in ("setuptools", "packaging")
                                   if importlib.util.find_spec(m) is None))
cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
try:  # cgroup v2 CPU quota (containers)
    quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
    if quota != "max":
        cpus = min(cpus, max(1, -(-int(quota) // int(period))))
except Exception:
    pass
out("cpu_count", cpus)
free = None
try:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            free = int(line.split()[1]) * 1024
    limit = open("/sys/fs/cgroup/memory.max").read().strip()
    if limit != "max":  # cgroup v2 memory limit (containers)
        used = int(open("/sys/fs/cgroup/memory.current").read())
        free = min(free or 1 << 62, int(limit) - used)
except Exception:
    pass
out("mem_free_gib", f"{free / 2**30:.1f}" if free is not None else "")
try:
    import torch
except Exception as exc:
    out("torch_error", f"{type(exc).__name__}: {exc}")
else:
    out("torch_version", torch.__version__)
    out("torch_cuda", torch.version.cuda)
    avail = torch.cuda.is_available()
    out("cuda_available", avail)
    count = torch.cuda.device_count() if avail else 0
    out("gpu_count", count)
    caps = []
    for i in range(count):
        major, minor = torch.cuda.get_device_capability(i)
        caps.append(f"{major}.{minor}")
    out("gpu_caps", ",".join(caps))
    try:  # $CUDA_HOME/bin, then $CONDA_PREFIX/bin, then PATH
        sys.path.insert(0, sys.argv[1])
        from helpers.environment import find_nvcc, nvcc_release, nvcc_toolkit
        nvcc = find_nvcc()
        out("nvcc", nvcc or "")
        out("nvcc_release", nvcc_release(nvcc) or "")
        out("nvcc_cuda_home", nvcc_toolkit(nvcc) or "")
    except Exception as exc:
        out("nvcc_error", f"{type(exc).__name__}: {exc}")

# This is the environment probe of build_apex.sh, run by the python Apex is built for (PYTHON),
# never by the build's own python, and never imported: coursetools.apexbuild.probe sends this
# file's text to `PYTHON - REPO_ROOT` on stdin. It prints key=value lines; every decision is
# made by coursetools.apexbuild.preflight from them. nvcc is looked up by the course's one
# implementation, helpers.environment.find_nvcc (the repo is its argument). It is kept line for
# line as it was written into the script, so that a traceback names the same lines; hence:
# ruff: noqa: E401, E402, E501, I001
