"""The backend conformance kit over every registered backend (hf, onnx, llamacpp, ...)."""

from river_conformance.kit import *  # noqa: F401,F403
