"""One module per notebook, for what that notebook measures and does not teach: each is
imported by its notebook as ``from helpers.chapters import <name>``, may use the core
(``helpers.*``) and ``helpers.gpt``, and never another chapter.

Adding a chapter: ``notebooks/NN_<topic>.ipynb``, ``helpers/chapters/<topic>.py`` and
``tests/test_<topic>.py`` (CONTRIBUTING.md says what each must hold); no list to edit."""
