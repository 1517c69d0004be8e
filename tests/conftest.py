import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))   # for tiny.py

# Derandomized: CI reruns the same examples; a failure is a finding, never a flake.
settings.register_profile("river", deadline=None, derandomize=True, max_examples=12,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("river")
