"""python -m benchmarks NAME [ARGS]: run benchmarks/NAME.py; `python -m benchmarks --help`
lists them, `python -m benchmarks NAME --help` explains one."""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_")
                 and p.stem not in ("common", "gsm8k", "humaneval"))


def _summary(name: str) -> str:
    text = (HERE / f"{name}.py").read_text()
    doc = text.split('"""')[1] if text.startswith('"""') else ""
    return " ".join(doc.strip().split("\n\n")[0].split())   # the first paragraph


if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
    print("usage: python -m benchmarks NAME [ARGS]   (NAME --help for its options)\n")
    for name in SCRIPTS:
        print(f"  {name:<20} {_summary(name)}")
    sys.exit(0)
if len(sys.argv) < 2 or sys.argv[1] not in SCRIPTS:
    sys.exit(f"usage: python -m benchmarks {{{','.join(SCRIPTS)}}} [ARGS]")
sys.path.insert(0, str(HERE))
script = HERE / f"{sys.argv[1]}.py"
sys.argv = [str(script), *sys.argv[2:]]
runpy.run_path(str(script), run_name="__main__")
