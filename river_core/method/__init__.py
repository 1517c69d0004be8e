"""The paper's method over the contract: when a token's state has settled (`predictor.py`),
when to exit (`policy.py`), what exiting must leave in the cache (`kv.py`), and what a
speculative round's verification costs and so how long a draft should be (`verify_costs.py`,
`draft_length.py`). Imports the contract and the settings."""
