"""``main``: one run of ``build_apex.sh``, start to end, and its exit status.

Options and environment (``options``, exit 2 on a usage error), every preflight check
(``preflight``, exit 3), the plan (``plan``), then for a real run the main build (``build``,
exit 4 when fetching or building fails, 5 when verification fails) and the legacy install
(``legacy``). Nothing is cloned or built before every check has passed."""

from __future__ import annotations

import os
import sys

from coursetools.apexbuild import build, legacy, options, plan, preflight
from coursetools.apexbuild.console import Stop, error_line, say

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(argv: list[str], env: dict[str, str], root: str) -> int:
    opts = options.parse(argv, env, root)
    pre = preflight.run(opts)
    plan.print_plan(pre)
    if opts.dry_run:
        if pre.fail_count:
            say(f"dry run: {pre.fail_count} preflight check(s) failed (the FAIL lines above; a "
                "real run stops at the first). Nothing was cloned, built or installed.")
            error_line(pre.first_fail_msg)
            return pre.first_fail_code
        say("dry run: nothing was cloned, built or installed.")
        return 0
    os.makedirs(opts.workdir, exist_ok=True)
    open(opts.verify_log, "wb").close()
    if opts.want_main:
        main_build = build.MainBuild(pre)
        if opts.force or not main_build.is_current():
            main_build.build()
    if opts.want_legacy:
        if opts.force or not legacy.is_current(pre):
            legacy.install(pre)
    return 0


def main(argv: list[str] | None = None, env: dict[str, str] | None = None,
         root: str | None = None) -> int:
    """Run with ``argv`` (default: the command line) in ``env`` (default: this process's
    environment; children get it, with what the build exports) for the course checkout ``root``
    (default: the one this package is in); return the exit status that ``--help`` lists."""
    argv = sys.argv[1:] if argv is None else list(argv)
    env = dict(os.environ if env is None else env)
    try:
        return run(argv, env, root or REPO_ROOT)
    except Stop as stop:
        return stop.code
    except OSError as exc:  # a folder or file the build must write cannot be written
        error_line(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
