"""Finding the python to build for and asking it about its environment.

The build runs under whatever Python 3 ``build_apex.sh`` found; the python Apex is built for
(``PYTHON``) may be another one, or missing, or broken. It is looked up the way a shell's
``command -v`` does, and asked everything in ONE subprocess: it runs ``target_probe.py`` (sent on
stdin, so that nothing of this package is imported there) and prints ``key=value`` lines, read
here the way the shell's ``IFS='=' read -r key value`` reads them."""

from __future__ import annotations

import os
import subprocess

PROBE_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "target_probe.py")


def command_path(name: str, env: dict[str, str]) -> str:
    """What ``command -v NAME`` prints for an executable file: NAME itself when it has a slash,
    else the first ``DIR/NAME`` on ``$PATH`` (an empty entry is ``.``); "" when not found."""

    def runnable(path: str) -> bool:
        return os.path.isfile(path) and os.access(path, os.X_OK)

    if not name:
        return ""
    if "/" in name:
        return name if runnable(name) else ""
    for entry in env.get("PATH", os.defpath).split(":"):
        folder = entry or "."
        candidate = f"{folder}{name}" if folder.endswith("/") else f"{folder}/{name}"
        if runnable(candidate):
            return candidate
    return ""


def decode(data: bytes) -> str:
    """A child's output as text, every byte kept (undecodable ones as surrogates)."""
    return data.decode("utf-8", "surrogateescape")


def run_probe(python_bin: str, root: str, env: dict[str, str]) -> tuple[bool, str]:
    """Run the probe (``PYTHON - ROOT``, the probe on stdin, its stderr passed through): whether
    it exited 0, and its stdout (read even when it did not: the plan shows what it printed)."""
    with open(PROBE_PROGRAM, "rb") as fh:
        program = fh.read()
    try:
        proc = subprocess.run([python_bin, "-", root], input=program, stdout=subprocess.PIPE,
                              env=env)
    except OSError:
        return False, ""
    return proc.returncode == 0, decode(proc.stdout)


def parse_probe(text: str) -> dict[str, str]:
    """``key=value`` lines as a dict: the key up to the first ``=``, the value the rest, less one
    trailing ``=`` when it holds no other (the shell's ``read`` with ``IFS='='``); lines without a
    key are skipped, and a later line wins."""
    values: dict[str, str] = {}
    for line in text.rstrip("\n").split("\n"):
        key, sep, value = line.partition("=")
        if sep and value.endswith("=") and "=" not in value[:-1]:
            value = value[:-1]
        if key:
            values[key] = value
    return values
