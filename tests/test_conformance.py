"""The backend conformance kit over every registered backend (hf, onnx, ...)."""

from river_core.conformance import *  # noqa: F401,F403
