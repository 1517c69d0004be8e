"""A minimal third-party backend: what an author writes to plug into River.

It implements the contract of river_core/backend.py by delegating the arithmetic to the
reference backend and counting the primitives the core calls, which is enough to show the
registration and to run the conformance kit (test_example_backend.py). A real backend puts its
own kernels where this one delegates.

Registered in the author's pyproject.toml:

    [project.entry-points.river_core]
    example = "example_backend"
"""

from collections import Counter

from river_core.hookspecs import hookimpl
from river_hf import tiny


class CountingBackend:
    name = "example"

    def __init__(self, inner) -> None:
        self._inner = inner
        self.calls: Counter = Counter()
        for field in ("num_layers", "max_positions", "capabilities", "tokenizer", "river_error"):
            setattr(self, field, getattr(inner, field))

    @property
    def offset(self) -> int:
        return self._inner.offset

    def __getattr__(self, primitive):
        """prefill, embed, layer, river_layer, project_kv, skip, layer_span, similarity, logits,
        commit, footprint, kv."""
        method = getattr(self._inner, primitive)

        def counted(*args):
            self.calls[primitive] += 1
            return method(*args)
        return counted


def make(family: str, seed: int, bits: int) -> CountingBackend:
    """The example backend over a tiny random model."""
    return CountingBackend(tiny.backend(family, seed, bits))


@hookimpl
def river_conformance_backends():
    return {"example": make}
