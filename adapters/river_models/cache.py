"""The user cache, and the one way River builds anything into it.

Root: RIVER_CACHE, else $XDG_CACHE_HOME/river, else ~/.cache/river. Every artifact (a converted
GGUF, an ONNX export, quantized stand-in weights) is built in a temporary sibling folder and
renamed into place, so an interrupted build leaves nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def cache_root() -> Path:
    if "RIVER_CACHE" in os.environ:
        return Path(os.environ["RIVER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "river"


def digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12]


def files_key(folder: Path) -> str:
    """Identifies a model folder by its files' names, sizes and modification times."""
    stats = [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
             for f in sorted(folder.iterdir()) if f.is_file()]
    return digest(folder.resolve(), *stats)


def cached(target: Path, done: str, build: Callable[[Path], object]) -> Path:
    """`target`, built by `build(folder)` first if `target/done` does not exist yet."""
    if (target / done).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".partial-"))
    try:
        build(tmp)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

