"""Build NVIDIA Apex for the course: what ``./build_apex.sh`` runs (``--help`` for options,
environment variables and exit codes).

Apex is not on PyPI (the ``apex`` package there is unrelated), so it is built from source at a
pinned commit, verified, and optionally joined by the legacy ``apex.amp`` in a folder of its own.
Every environment problem is caught by one probe of the python Apex is built for BEFORE
anything is cloned or built. This package runs under any Python 3.8+ and imports only the
standard library; what needs torch runs in that python, in a subprocess:

- ``constants``: the pinned commits, the estimate's figures with their source, the hint pins;
- ``options``: ``--help``, the options and environment variables (usage errors: exit 2);
- ``probe`` and ``target_probe``: finding that python and its one probe (``key=value`` lines);
- ``preflight``: every check, in order (exit 3), a dry run's FAIL / "not checked" bookkeeping;
- ``plan`` and ``estimate``: the plan, and the build-time estimate in it;
- ``build``: stage, trim (--course-only), pip install, verify, marker (exit 4 / 5);
- ``legacy`` and ``target_legacy_check``: the legacy apex.amp install and its check;
- ``cli``: ``main``, one run start to end; ``console``: the lines it prints.
"""
