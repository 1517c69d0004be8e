"""River's Hugging Face transformers + PyTorch backend. Loaded through the `river_core` entry
point `hf`; import `river_hf.backend.HFBackend` directly to wrap a model already in memory."""
