"""`river bench gpu`'s part 1: the suite's device-aware tests as one pytest run, its whole
output streamed to the part's log and its results to a JUnit XML, read back for the record."""

from __future__ import annotations

import importlib.util
import os
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# The sampled comparisons (the kit's three and tests/test_speculative.py's three): 400
# speculative generations one at a time a side, each; 13-16 s apiece on the CPU, an estimated
# 170-270 s in all on CUDA, one at a time (issue 61). They check the ratio test's arithmetic on
# the host; on CUDA the greedy tests already run every kernel they would. So they are
# deselected there (node-id prefixes), and run on the CPU in CI.
SAMPLED = ("tests/test_conformance.py::test_speculative_sampling_",
           "tests/test_speculative.py::test_speculative_sampling_with_top_k",
           "tests/test_speculative.py::test_the_kits_sampled_test_catches")
SAMPLED_REASON = ("the sampled comparisons (400 generations one at a time a side, each) "
                  "check host arithmetic, run on the CPU in CI, and would take 170-270 s of "
                  "the budget on CUDA")


def workers() -> int:
    """pytest-xdist's workers: one a core where it is installed (the lent image has it), none
    (one process) without it."""
    return len(os.sched_getaffinity(0)) if importlib.util.find_spec("xdist") else 0


def command(args, junit: Path) -> tuple[list[str], dict]:
    """Part 1's pytest command and environment: every test's outcome by name (-v), why each
    skip and failure (-rfEs) and the 20 slowest (what the next estimate is set from) in the
    output, the results in `junit`."""
    n = workers()
    kit = [a for name in args.kit_backends for a in ("--river-backend", name)]
    deselect = [a for prefix in SAMPLED for a in ("--deselect", prefix)] \
        if args.device.startswith("cuda") else []
    env = {**os.environ, "RIVER_TEST_DEVICE": args.device}
    if n:   # one thread a worker: workers x cores threads spin-wait each other (a 2-core
        env["OMP_NUM_THREADS"] = "1"   # CPU ran part 1 in 292 s so, in 44 s with one each)
    argv = [sys.executable, "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider",
            f"--junitxml={junit}", "--durations=20", *(["-n", str(n)] if n else []),
            *deselect, *args.tests, *kit]
    return argv, env


def summary(junit: Path) -> tuple[str, list[str]]:
    """The run's counts in one line, and its failed tests by name, from its JUnit XML."""
    root = ElementTree.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    count = lambda key: int(suite.get(key, 0))
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    passed = count("tests") - count("failures") - count("errors") - count("skipped")
    return (f"{passed} passed, {count('failures')} failed, {count('errors')} errors, "
            f"{count('skipped')} skipped in {float(suite.get('time', 0)):.0f} s"), failed
