"""Progress bars that show in interactive full-size runs and stay quiet in headless ones."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm import std

from helpers.profile import Profile


def progress(iterable: Iterable | None = None, *, profile: Profile, desc: str = "",
             total: int | None = None, **kwargs: Any) -> std.tqdm:
    """A tqdm bar whose ``disable`` comes from the profile (quiet when headless or smoke).

    Interactive runs get ``tqdm.auto`` (a widget in Jupyter when ipywidgets is installed, text
    otherwise); quiet runs get a disabled plain bar, so no widget warning reaches the output.
    """
    if not profile.show_progress:
        return std.tqdm(iterable, desc=desc, total=total, disable=True, **kwargs)
    from tqdm.auto import tqdm  # imported only here: it warns when ipywidgets is missing

    return tqdm(iterable, desc=desc, total=total, leave=False, **kwargs)
