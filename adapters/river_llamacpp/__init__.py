"""llama.cpp through llama-cpp-python: full depth only, the reference a CPU user runs today."""
