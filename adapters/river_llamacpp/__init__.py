"""llama.cpp through llama-cpp-python: full depth only, the reference a CPU user runs today."""

from river_core.contract.backend import Capabilities

# known before anything loads (no engine imported): a plan is checked before a long load
CAPABILITIES = Capabilities()   # full depth, one sequence: nothing beyond
