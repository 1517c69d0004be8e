"""ggml backend: River's layers on llama.cpp's own CPU kernels, over the user's GGUF."""

from river_core.contract.backend import Capabilities

# known before anything loads (no engine imported): no windowed drafts
CAPABILITIES = Capabilities(exits=True, stand_in=True, propagate=True, mask=True, recompute=True,
                            sub_blocks=True, verify=True, batch=True, keeps_prefill=True)
