"""The course's tooling, apart from what the notebooks import: the headless runner
(``python -m coursetools.runner``) and the reference-run report
(``python -m coursetools.report``)."""
