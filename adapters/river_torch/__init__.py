"""River's PyTorch backend (`hf`: it reads Hugging Face models, through the model package).
Loaded through the `river_core` entry point `hf`; build `river_torch.backend.TorchBackend` from a
`river_models.Checkpoint` to use it directly."""

from river_core.contract.backend import Capabilities

# known before anything loads (no engine imported): a plan is checked before a long load
CAPABILITIES = Capabilities(exits=True, stand_in=True, propagate=True, mask=True, recompute=True,
                            sub_blocks=True, verify=True, windowed_drafts=True, batch=True,
                            keeps_prefill=True)
