"""`river bench gpu`'s plan: its units (each part, and each shape of a part that runs shapes, a
process of its own with its own time limit), the order they run in, and what each is expected
to take on a lent H200.

The order puts the rows that matter most first (speed, then per-layer costs, then memory),
then the tests, then the parts a lent image skips. An estimate is a sum of costs measured on
the CPU, in the lent image's simulation (tests/test_gpu_image.py) on this project's machine
(AMD EPYC, AVX2, 2 cores, 2026-11-28; an idle machine's figures, a busy one's are slower),
each scaled by a stated factor: guesses until a GPU has run them. gpu.log's part 1 durations
and each part's seconds in gpu.json are what to set them from then.
"""

from __future__ import annotations

import math

import attrs

from river_core import ExitConfig

from . import shapes

PARTS = {1: "tests", 2: "speed", 3: "layers", 4: "memory", 5: "onnx", 6: "vllm"}
ORDER = (2, 3, 4, 1, 5, 6)   # speed rows first, then layers, memory, the tests
PER_SHAPE = ("speed", "layers", "memory")
BUDGET_S = 510   # the default call's seconds: 8.5 of a command's 10 minutes
SLACK = 0.15     # the share of the budget the default call's estimates leave free

# -- costs measured on the CPU (the machine above) --------------------------------------------
IMPORT_S = 2.0   # a child's start: python, torch, transformers, River (1.8-2.0 s)
# a random shape's draw and stand-ins (shapes.random_checkpoint, shared_stand_ins: numpy on
# one core), the host's share of every unit that loads the shape
DRAW_S = {"tiny": 0.1, "llama-1b": 16.4, "llama-8b": 46.7}
LAYER_MS = 0.33   # one decoding token through one layer of River's torch engine, host side:
                  # the tiny shape's 1.33 ms/token over 4 layers (one thread)
TESTS_S = 36.0    # part 1's default selection, the sampled comparisons deselected, one process
CONVERT_GB_S = 2.0   # float32 to bfloat16 on the host, 2.0-2.5 GiB/s (torch converts a blocking
                     # upload's dtype on the host: every layer's weights cross so)

# -- factors from those to a lent H200 (stated, not measured) ---------------------------------
CUDA_START_S = 5.0    # CUDA's context and the copy-bandwidth probe's 1 GiB copy
LAUNCH_FACTOR = 1.5   # a layer's host cost on CUDA over the CPU's: each op launches a kernel
COPY_GB_S = 4300.0    # the H200's device copy bandwidth (the device tool's KINDS.md, measured)
TEST_FACTOR = 2.0     # a tiny model's test on CUDA over the CPU (launch-bound)
TEST_WORKERS = 4      # the most speed-up pytest-xdist's workers get from sharing one GPU
DEVICE_CORES = 16     # a lent H200 machine's cores: part 1's workers there (KINDS.md)
DRAFTS = ExitConfig().draft_tokens   # River's default draft length (2)
LOSSLESS_PASSES = DRAFTS + 1   # a lossless token on random weights: its drafts rejected, and
                               # a verification
LIMIT_FACTOR = 2.0    # a unit's time limit over its estimate
OTHER_HOST_S = {"onnx": 150, "vllm": 240}   # parts a lent image skips: guesses for a GPU host
REAL_S = 60.0   # a part's work on the embedded model (135M weights): a guess


@attrs.frozen
class Unit:
    part: int
    shape: str | None     # None: the part's one process (the tests, the real model's parts)
    estimate_s: float
    how: str              # the estimate's terms

    @property
    def limit_s(self) -> int:
        return math.ceil(LIMIT_FACTOR * self.estimate_s)

    @property
    def name(self) -> str:
        return PARTS[self.part]

    def argv(self) -> list[str]:
        """The child's arguments beyond the call's (its shape instead of all)."""
        return ["--shapes", self.shape] if self.shape else []


def pass_ms(shape: str) -> float:
    """One token through every layer of random shape `shape` in bfloat16 on the device: the
    layers' host cost, then its weights read at the device's copy bandwidth."""
    s = shapes.SHAPES[shape]
    return s.layers * LAYER_MS * LAUNCH_FACTOR + 2 * s.params() / COPY_GB_S / 1e6


def upload_s(shape: str) -> float:
    """Every layer's float32 weights converted to bfloat16 on the host on their way."""
    return 4 * shapes.SHAPES[shape].params() / CONVERT_GB_S / 2 ** 30


def passes(name: str, args) -> int:
    """Tokens through every layer that part `name` runs on one shape (counted from its code:
    warm-ups, rounds, prompts, configurations)."""
    configs = 5   # grid_args' configurations: four a pass a token, lossless LOSSLESS_PASSES
    if name == "speed":
        per_token = configs - 1 + LOSSLESS_PASSES
        return configs * 4 + args.rounds * args.prompts * args.tokens * per_token
    if name == "layers":   # 20 of each layer kind, then 4 runs of plain, lossless, transformers
        return 40 + 4 * args.tokens * (1 + LOSSLESS_PASSES + 1)
    return args.tokens * (3 + LOSSLESS_PASSES)   # memory: backbone, exit, whole 4-bit, lossless


def unit(part: int, shape: str | None, args, workers: int) -> Unit:
    """Part `part` on `shape` and what it should take: a process's start, the shape's draw,
    its upload (twice for the layers part: transformers' copy too) and its tokens."""
    name, start = PARTS[part], IMPORT_S + CUDA_START_S
    if name == "tests":
        spread = TESTS_S * TEST_FACTOR / max(1, min(workers, TEST_WORKERS))
        return Unit(part, None, 2 * start + spread, f"start {start:.0f} s, workers' start "
                    f"{start:.0f} s, {TESTS_S:.0f} s of tests x {TEST_FACTOR:g} over "
                    f"{max(1, min(workers, TEST_WORKERS))} workers")
    if name in OTHER_HOST_S:
        return Unit(part, None, OTHER_HOST_S[name], "a guess")
    if shape not in shapes.SHAPES:   # a real model (`default`): no measured draw to scale
        return Unit(part, shape, start + REAL_S, "a guess")
    uploads = 2 if name == "layers" else 1
    build = DRAW_S.get(shape, 0.0) + uploads * upload_s(shape)
    work = passes(name, args) * pass_ms(shape) / 1e3
    return Unit(part, shape, start + build + work,
                f"start {start:.0f} s, draw {DRAW_S.get(shape, 0.0):.0f} s, upload "
                f"{uploads} x {upload_s(shape):.0f} s, {passes(name, args):,} passes x "
                f"{pass_ms(shape):.1f} ms")


def plan(parts, args, workers: int) -> list[Unit]:
    """The units of `parts`, in ORDER, each part's shapes in the order given."""
    out = []
    for part in sorted(parts, key=ORDER.index):
        name = PARTS[part]
        shape_list = args.shapes if name in PER_SHAPE else [None]
        out += [unit(part, shape, args, workers) for shape in shape_list]
    return out
