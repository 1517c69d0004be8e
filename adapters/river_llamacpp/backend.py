"""llama.cpp as a backend: full-depth generation and logits of a GGUF model, nothing more.

llama.cpp builds one compute graph over all layers and has no per-token exit, no hook to run a
single layer and no public access to its KV cache. So this backend keeps the required contract
alone (prefill and decode: `river_core.contract.backend.Backend`) and promises nothing else: the
core runs it with the `full` strategy only and refuses exit policies with a clear error. A real
integration would need llama.cpp to expose per-layer graph execution over a shared KV cache
(see docs/backends.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from river_core.contract.backend import Prefill, Step
from river_core.contract.footprint import Footprint
from river_core.settings.errors import CapabilityError

from . import CAPABILITIES

UNSUPPORTED = "llama.cpp cannot run single layers or exit early; use the full kv strategy"


class LlamaCppTokenizer:
    def __init__(self, llm) -> None:
        import llama_cpp.llama_chat_format as chat_format

        self._llm = llm
        self.eos_ids = frozenset([llm.token_eos()])
        template = llm.metadata.get("tokenizer.chat_template")
        vocab = [llm.token_eos(), llm.token_bos()]
        eos, bos = (llm.detokenize([t], special=True).decode(errors="ignore") for t in vocab)
        self._chat = template and chat_format.Jinja2ChatFormatter(template, eos, bos)

    def encode(self, text: str) -> list[int]:
        return self._llm.tokenize(text.encode(), add_bos=False, special=True)

    def decode(self, ids: Sequence[int]) -> str:
        return self._llm.detokenize(list(ids)).decode(errors="replace")

    def chat(self, prompt: str) -> list[int]:
        if not self._chat:
            return self.encode(prompt)
        return self.encode(self._chat(messages=[{"role": "user", "content": prompt}]).prompt)


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self, llm, num_layers: int, path) -> None:
        self._llm, self._path = llm, path
        self.model_name = Path(path).name
        self.num_layers = num_layers
        self.max_positions = llm.n_ctx()
        self.capabilities = CAPABILITIES
        self.runs_on = ("cpu",)
        self.tokenizer = LlamaCppTokenizer(llm)

    @property
    def offset(self) -> int:
        return self._llm.n_tokens

    def _eval(self, tokens: Sequence[int]) -> np.ndarray:
        import llama_cpp

        self._llm.eval(list(tokens))
        logits = llama_cpp.llama_get_logits_ith(self._llm.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(1, self._llm.n_vocab())).copy()

    def prefill(self, prompts, capacity: int, prefill_exit: int | None = None) -> Prefill:
        if prefill_exit is not None:
            raise CapabilityError(UNSUPPORTED)
        (prompt,) = prompts   # batch=False: the core never sends more than one
        self._llm.reset()
        logits = self._eval(prompt)
        return Prefill(logits, np.ones((1, self.num_layers)))

    def decode(self, tokens: Sequence[int], step: Step) -> np.ndarray:
        self._llm.n_tokens = step.start   # llama.cpp evaluates at its own token count
        return self._eval(tokens)

    def footprint(self) -> Footprint:
        """Tensor bytes in the GGUF file; K/V as float16 (llama.cpp's default cache type)."""
        from gguf import GGUFReader

        sizes = {t.name: int(t.n_bytes) for t in GGUFReader(self._path).tensors}
        layers, kv = [0] * self.num_layers, [0] * self.num_layers
        for name, size in sizes.items():
            if name.startswith("blk."):
                i = int(name.split(".")[1])
                layers[i] += size
                kv[i] += size if name.split(".")[2] in ("attn_k", "attn_v") else 0
        # tied embeddings: the head reads the embedding table
        head = sizes["output_norm.weight"] + sizes.get("output.weight", sizes["token_embd.weight"])
        meta = self._llm.metadata
        arch = meta["general.architecture"]
        kv_heads = int(meta[f"{arch}.attention.head_count_kv"])
        width, heads = (int(meta[f"{arch}.{key}"])
                        for key in ("embedding_length", "attention.head_count"))
        head_dim = width // heads
        return Footprint(tuple(layers), (0,) * self.num_layers, tuple(kv), head,
                         2 * kv_heads * head_dim * 2)
