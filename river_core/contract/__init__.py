"""What a backend supplies and the core keeps for it: the backend protocols (`backend.py`), the
plugin hook specifications (`hookspecs.py`), where a batch's tokens sit and the cache that owns
them (`layout.py`, `cache.py`), the bookkeeping every layer-by-layer engine shares
(`layer_engine.py`, `switch.py`), and what an engine reports (`footprint.py`, `phases.py`).
Imports only the settings. A backend author needs this package and the conformance kit."""
