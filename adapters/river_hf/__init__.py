"""River's PyTorch backend (`hf`: it reads Hugging Face models, through the model package).
Loaded through the `river_core` entry point `hf`; build `river_hf.backend.HFBackend` from a
`river_models.Checkpoint` to use it directly."""
