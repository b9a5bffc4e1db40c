"""Progress bars that show in interactive full-size runs and stay quiet in headless ones."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

from helpers.profile import Profile


def progress(iterable: Iterable | None = None, *, profile: Profile, desc: str = "",
             total: int | None = None, **kwargs: Any) -> tqdm:
    """``tqdm.auto`` with ``disable`` taken from the profile (quiet when headless or smoke)."""
    return tqdm(iterable, desc=desc, total=total, disable=not profile.show_progress,
                leave=False, **kwargs)
