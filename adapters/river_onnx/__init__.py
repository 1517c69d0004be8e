"""ONNX Runtime backend: a transformers model exported into per-layer ONNX graphs."""
