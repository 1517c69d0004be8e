"""The generation loop: the walk through the layers and its exit decisions (`decode.py`),
lossless mode's rounds and their n-gram drafts (`speculative.py`, `ngram.py`, `drafting.py`),
sampling, the check of every step's logits and the streaming detokenizer (`sampling.py`,
`finite.py`, `detokenize.py`). Imports the method, the contract and the settings; the registry,
the plan and `RiverModel` sit above it."""
