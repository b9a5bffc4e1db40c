"""The course's tooling, apart from what the notebooks import: the headless runner
(``python -m coursetools.runner``; ``--report``: a reference run into ``reports/<gpu>/``)."""
