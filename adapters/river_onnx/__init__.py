"""ONNX Runtime backend: a model package checkpoint exported into per-layer ONNX graphs."""
