"""River's benchmarks: one thin script a benchmark (each module here, its `main(argv)`), the
library they share in `library/`; each `main` starts from the one harness,
`library.output.Harness` (its arguments parsed, where its results go, the machine and the load
average around the run, the command that reruns it), and its page from `heading`. Run as `river bench NAME [ARGS]` (installed as package
`river_bench`) or `python -m benchmarks NAME [ARGS]` in a source checkout. Results go to
`--out` (default ./river-results); `--docs` updates a checkout's docs/results."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from river_core.contract.hookspecs import hookimpl

HERE = Path(__file__).resolve().parent
MODULES = {"vllm": "vllm_serving"}   # a benchmark named after a package lives under another name


def names() -> list[str]:
    inverse = {module: name for name, module in MODULES.items()}
    return sorted(inverse.get(p.stem, p.stem) for p in HERE.glob("*.py")
                  if not p.stem.startswith("_"))


def summary(name: str) -> str:
    """The first paragraph of a benchmark's docstring, on one line (read, not imported)."""
    text = (HERE / f"{MODULES.get(name, name)}.py").read_text()
    doc = text.split('"""')[1] if text.startswith('"""') else ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def listing(prog: str) -> str:
    return "\n".join([f"usage: {prog} NAME [ARGS]   (NAME --help for its options)", "",
                      *[f"  {n:<20} {summary(n)}" for n in names()]])


def run(name: str, argv: list[str], prog: str) -> None:
    """Run benchmark `name` with `argv`."""
    if name not in names():
        sys.exit(f"{prog}: unknown benchmark {name!r}\n\n{listing(prog)}")
    module = importlib.import_module(f"{__name__}.{MODULES.get(name, name)}")
    module.main(argv)


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
