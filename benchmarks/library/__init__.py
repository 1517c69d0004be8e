"""What River's benchmarks share: where results go (output.py), the machine and timings
(timing.py), prompts and task data (prompts.py, gsm8k.py, humaneval.py), the task runs' records
and configurations (runs.py), comparisons of outputs (measures.py), and the anchors' engines in
their own environment (environments.py, anchor_worker.py). Each benchmark is one thin script
beside this folder."""
