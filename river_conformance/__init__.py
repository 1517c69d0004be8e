"""River's backend conformance kit: the backend contract as property tests, for any backend.

`kit.py` holds the tests and `Subject` (a backend under test); `plugin.py` is the pytest plugin
that offers the `conformance_backend` fixture. See docs/backends.md.
"""
