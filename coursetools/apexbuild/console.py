"""The three kinds of line the build prints, all prefixed with the script's name: progress on
stdout (``say``), warnings and the one error on stderr (``warn``, ``die``). ``die`` ends the run
by raising :class:`Stop`, which ``cli.main`` turns into the exit status."""

from __future__ import annotations

import sys

from coursetools.apexbuild.constants import PROG


class Stop(Exception):
    """End the run with exit status ``code`` (its message, if any, is printed already)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def say(*words: str) -> None:
    print(f"{PROG}: {' '.join(words)}", file=sys.stdout)


def warn(*words: str) -> None:
    print(f"{PROG}: warning: {' '.join(words)}", file=sys.stderr)


def error_line(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def die(code: int, *words: str) -> None:
    """Print ``build_apex.sh: error: WORDS`` and stop with ``code``."""
    error_line(" ".join(words))
    raise Stop(code)


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it (128 + N for a child killed by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def tail(path: str, count: int = 30) -> None:
    """Write the last ``count`` lines of ``path`` to stderr, as ``tail -n COUNT PATH >&2``."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return
    body, end = (data[:-1], b"\n") if data.endswith(b"\n") else (data, b"")
    if not data:
        return
    text = b"\n".join(body.split(b"\n")[-count:]) + end
    sys.stderr.flush()
    raw = getattr(sys.stderr, "buffer", None)
    if raw is None:
        sys.stderr.write(text.decode("utf-8", "replace"))
    else:
        raw.write(text)
        raw.flush()


def run_logged(cmd: list[str], cwd, env: dict, log) -> int:
    """Run ``cmd`` with its stdout and stderr into the open binary ``log``; its exit status
    (126, with the reason in the log, when it cannot start)."""
    import subprocess

    try:
        return exit_status(subprocess.run(cmd, cwd=cwd, env=env, stdout=log,
                                          stderr=subprocess.STDOUT).returncode)
    except OSError as exc:
        log.write(f"{exc}\n".encode("utf-8", "surrogateescape"))
        return 126
