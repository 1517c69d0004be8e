from hypothesis import HealthCheck, settings

# Derandomized: CI reruns the same examples; a failure is a finding, never a flake.
settings.register_profile("river", deadline=None, derandomize=True, max_examples=12,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("river")
