"""Compute shared by River's engines, below them and above the model package: the decoder
layer written once over each engine's primitives (`skeleton.py`), and River's torch blocks,
which the two torch engines (the torch engine and River inside vLLM) run (`torch_blocks.py`,
imported only by them, so the base install needs no torch)."""
