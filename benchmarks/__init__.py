"""River's benchmarks: one script a benchmark, run as `river bench NAME [ARGS]` (installed as
package `river_bench`) or `python -m benchmarks NAME [ARGS]` from a source checkout. Results go
to docs/results/ in a checkout, else to ./river-results/ ($RIVER_RESULTS overrides both)."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from river_core.hookspecs import hookimpl

HERE = Path(__file__).resolve().parent
HELPERS = ("common", "gsm8k", "humaneval", "anchor_worker")


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py")
                  if not p.stem.startswith("_") and p.stem not in HELPERS)


def summary(name: str) -> str:
    """The first paragraph of a benchmark's docstring, on one line."""
    text = (HERE / f"{name}.py").read_text()
    doc = text.split('"""')[1] if text.startswith('"""') else ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def listing(prog: str) -> str:
    return "\n".join([f"usage: {prog} NAME [ARGS]   (NAME --help for its options)", "",
                      *[f"  {n:<20} {summary(n)}" for n in names()]])


def run(name: str, argv: list[str], prog: str) -> None:
    """Run benchmark `name` as a script, its siblings importable (they import each other)."""
    if name not in names():
        sys.exit(f"{prog}: unknown benchmark {name!r}\n\n{listing(prog)}")
    if str(HERE) not in sys.path:   # last: a benchmark named after a package (vllm) must
        sys.path.append(str(HERE))    # not shadow it
    script = HERE / f"{name}.py"
    sys.argv = [f"{prog} {name}", *argv]
    runpy.run_path(str(script), run_name="__main__")


def bench(parser: argparse.ArgumentParser):
    """Run a benchmark: the task, speed, calibration and other measurements of docs/."""
    parser.description = listing("river bench")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("name", nargs="?", help="the benchmark (listed above)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (NAME --help)")

    def start(args) -> int:
        if args.name is None:
            print(listing("river bench"))
            return 0
        run(args.name, args.args, "river bench")
        return 0
    return start


@hookimpl
def river_commands():
    return {"bench": bench}
