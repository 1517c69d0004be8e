"""ONNX Runtime backend: a model package checkpoint exported into per-layer ONNX graphs."""

from river_core.contract.backend import Capabilities

# known before anything loads (no engine imported): a plan is checked before a long load
CAPABILITIES = Capabilities(exits=True, stand_in=True, propagate=True, mask=True, recompute=True,
                            sub_blocks=True, batch=True, verify=True, windowed_drafts=True,
                            keeps_prefill=True)
