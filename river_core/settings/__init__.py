"""What a run is asked to do, below everything else in the core: the value types of a
generation's settings (`config.py`), the policies' and strategies' options (`options.py`), the
errors River raises (`errors.py`), and the machine and user cache that measurements are keyed
by and kept in (`machine.py`, `user_cache.py`). Imports nothing else of the core."""
