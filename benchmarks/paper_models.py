"""The memory each of the paper's four models needs in each engine, from the dimensions in
their config.json files (transcribed below: nothing is downloaded). Prints the table of
docs/models.md: `python benchmarks/paper_models.py`.

Weights: every parameter at the engine's precision. Stand-ins: River's default (4 bits, groups
of 64, a bfloat16 scale and zero point a group, as the hf engine packs them) for every layer's
seven projections, plus the LM head's 8-bit stand-in (one bfloat16 scale a row). Cache: K and V
of every layer per position at the engine's precision."""

from __future__ import annotations

import attrs


@attrs.frozen
class Dims:
    name: str          # the hub id
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    def projection_params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.intermediate)

    def params(self) -> int:
        norms = (2 * self.layers + 1) * self.hidden
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.projection_params() + norms + embed

    def stand_in_bytes(self, bits: int = 4, group: int = 64) -> int:
        layers = self.projection_params() * (bits / 8 + 2 * 2 / group)
        head = self.vocab * self.hidden + 2 * self.vocab
        return int(layers + head)

    def cache_bytes_per_position(self, element: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element


# from each model's config.json on the Hugging Face hub (Ministral 3: its text_config)
PAPER = (
    Dims("meta-llama/Llama-3.2-1B", 16, 2048, 8192, 32, 8, 64, 128256, True),
    Dims("meta-llama/Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128, 128256, False),
    Dims("microsoft/Phi-4-mini-instruct", 32, 3072, 8192, 24, 8, 128, 200064, True),
    Dims("mistralai/Ministral-3-8B-Instruct-2512", 34, 4096, 14336, 32, 8, 128, 131072, False),
)
# element bytes of weights and cache per engine as River runs it by default: hf on the CPU in
# float32 (--dtype bfloat16: 2), onnx's float32 graphs, vLLM in the checkpoint's bfloat16
ENGINES = {"hf": 4, "onnx": 4, "vllm": 2}
CONTEXT = 8192   # positions of cache in the table


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f}"


def table() -> str:
    rows = ["| model | parameters | engine | weights GiB | stand-ins GiB | cache GiB at "
            f"{CONTEXT:,} positions |", "|---|---|---|---|---|---|"]
    for d in PAPER:
        for engine, element in ENGINES.items():
            rows.append(f"| {d.name} | {d.params() / 1e9:.2f} B | {engine} | "
                        f"{gib(d.params() * element)} | {gib(d.stand_in_bytes())} | "
                        f"{gib(CONTEXT * d.cache_bytes_per_position(element))} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
