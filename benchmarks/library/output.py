"""Where a benchmark's results go, and how they are written.

Every benchmark takes `--out DIR` (default: ./river-results in the current folder, or
$RIVER_RESULTS) and, in a source checkout, `--docs`: write into the checkout's docs/results/,
the committed figures. Without `--docs` a benchmark never writes into the checkout or the
installed package. Resumable records go to `runs/` under the same folder.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

from . import quiet

CHECKOUT = Path(__file__).resolve().parents[2]
DOCS = CHECKOUT / "docs/results"
IN_CHECKOUT = DOCS.is_dir() and (CHECKOUT / "pyproject.toml").is_file()


def parser(name: str, doc: str, model: bool = True,
           results: str | None = None) -> argparse.ArgumentParser:
    """A benchmark's argument parser: `river bench NAME`, its docstring's first paragraph as
    the description, the arguments every benchmark takes and, given `results`, `--name` for
    its results files (that by default)."""
    ap = argparse.ArgumentParser(prog=f"river bench {name}",
                                 description=" ".join(doc.strip().split("\n\n")[0].split()))
    arguments(ap, model)
    if results is not None:
        ap.add_argument("--name", default=results, help="results file name")
    return ap


def command(name: str, argv: list[str] | None) -> str:
    """The command line that reruns a benchmark, for its results."""
    return " ".join(["river bench", name, *(sys.argv[1:] if argv is None else argv)])


def passed_on(args: argparse.Namespace) -> list[str]:
    """The arguments that make another benchmark run write where this one does, on the same
    model."""
    where = ["--docs"] if args.docs else ["--out", str(args.out)] if args.out else []
    return where + (["--model", args.model] if getattr(args, "model", None) else [])


def arguments(parser: argparse.ArgumentParser, model: bool = True) -> None:
    """The arguments every benchmark takes: where results go, and the model it measures."""
    parser.add_argument("--out", type=Path, help="folder for the results (default: "
                        "$RIVER_RESULTS or ./river-results)")
    parser.add_argument("--docs", action="store_true",
                        help="write into the checkout's docs/results (the committed figures)")
    if model:
        parser.add_argument("--model", help="a Hugging Face folder or .gguf (default: the "
                            "embedded SmolLM2-135M-Instruct)")


def commit() -> str | None:
    """The checkout's commit, `+` marking uncommitted changes (None: not a git checkout)."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(CHECKOUT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + "+" * bool(dirty.strip())


class Output:
    """A benchmark's results folder. It reads the machine's state when it is made (a
    benchmark makes it first) and when the results are written (`quiet.py`): every result
    records it, and a `--docs` run on a busy machine writes into the default folder instead
    of docs/results, and says so."""

    def __init__(self, args: argparse.Namespace) -> None:
        if args.docs and not IN_CHECKOUT:
            raise SystemExit("--docs writes into a source checkout's docs/results; this River "
                             "is installed without one (use --out)")
        self.default = Path(os.environ.get("RIVER_RESULTS") or Path.cwd() / "river-results")
        self.docs = bool(args.docs)
        self.folder = Path(DOCS if args.docs else args.out or self.default)
        self.runs = self.folder / "runs"
        self.start = quiet.read(bandwidth=self.docs)

    def path(self, name: str) -> Path:
        """A file of this run's results (made on demand)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder / name

    def write(self, name: str, payload: dict, markdown: str) -> None:
        """`name`.json and `name`.md, each with the machine's state, and the markdown on
        stdout; a `--docs` run on a busy machine writes into the default folder instead."""
        end = quiet.read(bandwidth=self.docs)
        cores = os.cpu_count() or 1
        state = quiet.state(self.start, end, cores,
                            quiet.quiet_bandwidth([self.start, end]) if self.docs else None)
        payload = payload | {"machine_state": state, "commit": commit()}
        markdown = markdown.rstrip("\n") + f"\n\n{quiet.describe(state)} Commit " \
            f"{payload['commit'] or 'unknown'}.\n"
        if self.docs and state["busy"]:   # its plots, written after, go there too
            self.folder = self.default
            print(f"river bench: the machine was busy ({state['busy']}): the results go to "
                  f"{self.folder}, not docs/results", file=sys.stderr)
        self.path(f"{name}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
        self.path(f"{name}.md").write_text(markdown)
        print(markdown)

    def read(self, name: str, script: str) -> dict:
        """A result this folder holds (another run's), or a clear exit saying how to make it."""
        path = self.folder / f"{name}.json"
        if not path.is_file():
            raise SystemExit(f"{path} not found: run `river bench {script}` with the same --out "
                             f"first (it writes {name}.json; see its --help)")
        return json.loads(path.read_text())

    def runs_by_engine(self, names, script: str) -> dict:
        """Each named result (one run of `script` per engine), by engine."""
        runs = {name: self.read(name, script) for name in names}
        return {r["args"]["backend"]: r for r in runs.values()}


class Harness(Output):
    """One run of a benchmark, the harness every benchmark's `main` starts with: its arguments
    (parsed here), where its results go (an `Output`), the machine it runs on, the load average
    around the work, and the command that reruns it."""

    def __init__(self, parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
        self.args = parser.parse_args(argv)
        super().__init__(self.args)
        self.command = command(parser.prog.split()[-1], argv)
        self.load = {"start": os.getloadavg()[0]}

    @functools.cached_property
    def machine(self) -> dict:
        """The CPU, its cores and copy bandwidth (`timing.machine`), measured where first read:
        a second of copying that a benchmark which records no machine never spends."""
        from .timing import machine

        return machine()

    @classmethod
    def parse(cls, parser: argparse.ArgumentParser, argv: list[str] | None
              ) -> tuple["Harness", argparse.Namespace]:
        """A run of the benchmark `parser` describes, and its arguments."""
        run = cls(parser, argv)
        return run, run.args

    def head(self) -> dict:
        """What every result records first: the command, the machine, and the load average
        from the start to now (1 minute's: other work on the machine slows every figure)."""
        self.load["end"] = os.getloadavg()[0]
        return {"command": self.command, "machine": self.machine, "load_average": self.load}

    def arguments(self) -> dict:
        """The run's arguments as a result records them (paths as text)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()}


def heading(title: str, payload: dict) -> list[str]:
    """A result page's first lines: its title, the command that made it, and the machine it
    ran on with the load average around the run (as `Harness.head` recorded them)."""
    m, load = payload["machine"], payload.get("load_average")
    where = f"Machine: {m['cpu']} ({m['cores']} cores; {', '.join(m['extensions'])}), copy " \
            f"bandwidth {m['memory_bandwidth_gb_s']} GB/s"
    if load:
        where += f", load average (1 minute) {load['start']:.1f} at the start, " \
                 f"{load['end']:.1f} at the end"
    return [f"# {title}", "", f"Command: `{payload['command']}`", "", f"{where}.", ""]


def engine_heading(engine: str, run: dict) -> list[str]:
    """A result page's section for one engine's run: its command and machine."""
    info = run["machine"]
    rss = f", peak RSS {info['peak_rss_mb']:.0f} MB" if "peak_rss_mb" in info else ""
    return [f"## {engine}", "", f"Command: `{run['command']}`", "",
            f"Machine: {info['cpu']}, {info['cores']} cores, copy bandwidth "
            f"{info['memory_bandwidth_gb_s']} GB/s{rss}.", ""]


def plot_file(output: Output, name: str):
    """A matplotlib figure saver for `name`.png (Agg backend, no display)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("river bench draws its plots with matplotlib: "
                         "pip install river-bench (-e ./benchmarks in River's checkout)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig) -> None:
        fig.tight_layout()
        fig.savefig(output.path(f"{name}.png"), dpi=120)
        plt.close(fig)
    return plt, save
