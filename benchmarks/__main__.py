"""python -m benchmarks NAME [ARGS]: run benchmarks/NAME.py (tasks, speed, predictor_fidelity,
river_kv_error)."""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_")
                 and p.stem not in ("common", "gsm8k", "humaneval"))

if len(sys.argv) < 2 or sys.argv[1] not in SCRIPTS:
    sys.exit(f"usage: python -m benchmarks {{{','.join(SCRIPTS)}}} [ARGS]")
sys.path.insert(0, str(HERE))
script = HERE / f"{sys.argv[1]}.py"
sys.argv = [str(script), *sys.argv[2:]]
runpy.run_path(str(script), run_name="__main__")
