"""Speculative mode's verification costs (verify_costs.py), measured once and kept in the user
cache, so a CLI call does not measure them again, and where no draft can pay takes plain steps
from its first round (docs/benchmarks.md, "Defaults that never lose"). What verifying costs is
the CPU's, the engine's and the model's: a file is keyed by the engine, the model's bytes per
layer (its `footprint`, where it has one) and the CPU (`machine.cpu_key`: another CPU's is
remeasured, not trusted); an entry in it by the context's power of two."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..settings.machine import cpu_key
from ..settings.user_cache import cache_root
from ..method.verify_costs import VerifyCosts

FORMAT = 4   # bump when VerifyCosts.as_json changes


def model_key(backend) -> str:
    """The engine and the model as drafting's cost sees them."""
    footprint = getattr(backend, "footprint", None)
    shape = footprint() if footprint else (backend.num_layers,)
    return f"{backend.name}|{shape!r}"


class DraftStore:
    """One JSON file per (engine, model, CPU) under the user cache: context key -> costs."""

    def __init__(self, backend, root: Path | None = None) -> None:
        name = hashlib.sha256(f"{FORMAT}|{model_key(backend)}|{cpu_key()}".encode()) \
            .hexdigest()[:16]
        self.path = (root or cache_root()) / "drafts" / f"{backend.name}-{name}.json"

    def read(self, key: str) -> VerifyCosts | None:
        try:
            return VerifyCosts.from_json(self._entries()[key])
        except (KeyError, TypeError, ValueError):   # none yet, or damaged: measured afresh
            return None

    def _entries(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def write(self, key: str, costs: VerifyCosts) -> None:
        """`costs` under `key`, replacing the file whole (a reader never sees half of it);
        a cache that cannot be written costs only the next process's measurement."""
        entries = self._entries() | {key: costs.as_json()}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(entries))
            os.replace(tmp, self.path)
        except OSError:
            pass
