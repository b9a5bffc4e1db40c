import os, sys
from apex import amp  # noqa: F401  (the whole point of the legacy install)
import apex
where = os.path.realpath(apex.__file__)
assert where.startswith(os.path.realpath(sys.argv[1]) + os.sep), f"apex came from {where}"
print(f"legacy apex.amp OK from {where}")

# The legacy install's check, run by the python Apex is built for as `PYTHON - LEGACY_DIR`
# (this file's text on stdin, PYTHONPATH=LEGACY_DIR first), never by the build's own python
# and never imported (coursetools.apexbuild.legacy): `from apex import amp` works, and apex
# comes from the legacy folder. Kept line for line as it was written into the script, hence:
# ruff: noqa: E401, I001
