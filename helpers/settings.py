"""The environment variables through which ``make``, the runner, a test or a learner hand the
course its settings: each name defined once, here, and imported wherever it is read or set."""

PROFILE_VAR = "COURSE_PROFILE"  # smoke, full or auto (run_profile.resolve)
HEADLESS_VAR = "COURSE_HEADLESS"  # "1": executed headless (the runner), no progress bars
RESULTS_DIR_VAR = "COURSE_RESULTS_DIR"  # where results go (results.results_dir)
# Rehearse a smaller card on a bigger one: COURSE_GPU_MEMORY_GIB=15 caps what this process may
# allocate (torch.cuda.set_per_process_memory_fraction); every size rule reads the capped value.
MEMORY_VAR = "COURSE_GPU_MEMORY_GIB"
COMMIT_VAR = "COURSE_COMMIT"  # the course's commit, for a copy without .git
REPO_VAR, REF_VAR = "COURSE_REPO", "COURSE_REF"  # where a notebook opened alone installs from
LEGACY_DIR_VAR = "COURSE_LEGACY_AMP_DIR"  # the legacy apex.amp install, for notebook 04's child
# The tests' smoke run takes only these notebooks (numbers, e.g. "08" or "05,07"): a new
# chapter's quick loop; unset, every notebook runs (tests/conftest.py)
TEST_NOTEBOOKS_VAR = "COURSE_TEST_NOTEBOOKS"
# Read by the scripts, not by Python: the Python the course runs in, and the lab's environment
PYTHON_VAR, LAB_VENV_VAR = "COURSE_PYTHON", "COURSE_LAB_VENV"
# Every course setting: a COURSE_* name close to one of these is a misspelling (the runner says so)
KNOWN = (PROFILE_VAR, HEADLESS_VAR, RESULTS_DIR_VAR, MEMORY_VAR, COMMIT_VAR, REPO_VAR, REF_VAR,
         LEGACY_DIR_VAR, TEST_NOTEBOOKS_VAR, PYTHON_VAR, LAB_VENV_VAR)
