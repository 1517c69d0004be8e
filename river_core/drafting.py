"""Speculative mode's draft length, kept from one generation to the next: in the process
(`RiverModel`), and in the user cache between processes, so a CLI call does not pay again for
the first rounds' trials where drafts do not pay (docs/benchmarks.md, "Defaults that never
lose"). What drafting costs is the CPU's, the engine's and the model's: an entry is keyed by
the engine, the model's bytes per layer (its `footprint`, where it has one), the CPU
(`machine.cpu_key`: another CPU's is remeasured, not trusted), the settings and the context's
power of two. An entry is a start, not a verdict: the length keeps measuring and trying the
other way (`DraftLength`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .machine import cpu_key
from .user_cache import cache_root

FORMAT = 3   # bump when DraftLength.state changes


def model_key(backend) -> str:
    """The engine and the model as drafting's cost sees them."""
    footprint = getattr(backend, "footprint", None)
    shape = footprint() if footprint else (backend.num_layers,)
    return f"{backend.name}|{shape!r}"


class DraftStore:
    """One JSON file per (engine, model, CPU) under the user cache: settings key -> state."""

    def __init__(self, backend, root: Path | None = None) -> None:
        name = hashlib.sha256(f"{FORMAT}|{model_key(backend)}|{cpu_key()}".encode()) \
            .hexdigest()[:16]
        self.path = (root or cache_root()) / "drafts" / f"{backend.name}-{name}.json"

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):   # none yet, or damaged: measured afresh
            return {}

    def write(self, key: str, state: dict) -> None:
        """`state` under `key`, replacing the file whole (a reader never sees half of it);
        a cache that cannot be written costs only the next process's trials."""
        entries = self.read() | {key: state}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(entries))
            os.replace(tmp, self.path)
        except OSError:
            pass
