"""Where River keeps what it makes or learns once per machine: converted models, stand-ins,
calibration profiles, the draft length's measurements (`drafting.py`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """River's user cache, one root for all of it: $RIVER_CACHE, else
    $XDG_CACHE_HOME/river or ~/.cache/river."""
    if "RIVER_CACHE" in os.environ:
        return Path(os.environ["RIVER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "river"
