"""The layering rule (docs/architecture.md): the core imports no other package, and inside it
each layer only those below (settings, contract, method, loop, then the registry, the plan and
`RiverModel` on top); the model package only the core; the shared compute the core and the
model package; the application and the kit those and the compute (the example backend runs the
skeleton); no engine another (the torch engines share River's torch blocks through the shared
compute), an engine reaching the kit only for its fixtures (the tiny models its conformance
hook runs); no package imports itself in a circle; nothing imports another package's private
names; the core's public API is exported on purpose; the base install imports no torch."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {p.name: p
            for p in [*ROOT.glob("river_*"), *(ROOT / "adapters").glob("river_*"),
                      *(ROOT / "plugins").glob("river_*")] if (p / "__init__.py").is_file()}
PACKAGES["river_bench"] = ROOT / "benchmarks"   # installed under that name
BACKENDS = {"river_torch", "river_onnx", "river_llamacpp", "river_ggml"}
ALLOWED = {
    "river_core": set(),
    "river_models": {"river_core"},
    "river_compute": {"river_core", "river_models"},
    "river_cli": {"river_core", "river_models"},
    "river_conformance": {"river_core", "river_models", "river_compute"},
    "river_policies": {"river_core"},
    **{b: {"river_core", "river_models", "river_compute", "river_conformance"}
       for b in BACKENDS | {"river_vllm"}},
    # the benchmarks measure everything; nothing imports them
    "river_bench": {"river_core", "river_models", "river_compute", "river_cli",
                    "river_conformance", "river_policies", *BACKENDS, "river_vllm"},
}
# the core's layers, bottom first; a module of one imports only its own layer and those below
CORE_LAYERS = ["settings", "contract", "method", "loop", None]   # None: the top (registry...)


def imports(name: str, package: Path | None = None):
    """(module, imported module, names) for every import statement anywhere in package `name`
    (at `package`; default: the project's folder), inside functions too, relative ones
    resolved; module names are dotted from the package."""
    package = package or PACKAGES[name]
    for source in sorted(package.rglob("*.py")):
        parts = source.relative_to(package).with_suffix("").parts
        module = ".".join((name, *parts[:-1], *([] if parts[-1] == "__init__"
                                                 else [parts[-1]])))
        here = module.split(".") if parts[-1] == "__init__" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield module, alias.name, []
            elif isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                names = [a.name for a in node.names]
                if node.module is None:   # `from . import x`: x may be a module
                    for imported in names:
                        yield module, f"{target}.{imported}", []
                yield module, target, names


def circles(name: str, package: Path | None = None) -> list[list[str]]:
    """Each module of package `name` that imports itself through others, as the loop."""
    edges = list(imports(name, package))
    modules = {m for m, _, _ in edges}
    graph = {m: set() for m in modules}
    for module, target, _ in edges:
        if target in modules and target != module and not module.startswith(target + "."):
            graph[module].add(target)

    def circle_from(start):
        path, seen = [start], set()

        def visit(m):
            for n in graph[m]:
                if n == start:
                    return path + [n]
                if n not in seen:
                    seen.add(n)
                    path.append(n)
                    if found := visit(n):
                        return found
                    path.pop()
            return None
        return visit(start)

    return [c for c in map(circle_from, sorted(graph)) if c]


def test_every_package_is_covered_by_the_rule():
    assert set(PACKAGES) == set(ALLOWED)


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_no_package_edits_the_import_path(name):
    edits = [str(p.relative_to(ROOT)) for p in PACKAGES[name].rglob("*.py")
             if "sys.path" in p.read_text()]
    assert not edits


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_package_imports_only_what_the_layering_allows(name):
    found = {target.split(".")[0] for _, target, _ in imports(name)}
    assert {p for p in found if p in PACKAGES} - {name} <= ALLOWED[name]


def test_an_engine_reaches_the_kit_only_for_its_fixtures():
    reached = {f"{module}: {target}" for name in BACKENDS | {"river_vllm"}
               for module, target, _ in imports(name)
               if target.split(".")[0] == "river_conformance"
               and not target.startswith("river_conformance.fixtures")}
    assert not reached


def core_layer(module: str):
    """The layer of a river_core module (None: the top)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in CORE_LAYERS else None


def test_each_layer_of_the_core_imports_only_those_below():
    upward = [f"{module} -> {target}" for module, target, names in imports("river_core")
              for t in [target, *(f"{target}.{n}" for n in names)]
              if t.startswith("river_core.") and module != "river_core"
              and CORE_LAYERS.index(core_layer(t)) > CORE_LAYERS.index(core_layer(module))]
    assert not upward
    assert {core_layer(m) for m, _, _ in imports("river_core")} == set(CORE_LAYERS)


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_no_module_imports_itself_in_a_circle(name):
    found = circles(name)
    assert not found, " -> ".join(found[0])


def test_the_circle_rule_sees_relative_imports_inside_functions(tmp_path):
    """A loop closed by a relative import inside a function, in a module read after a
    `from . import x` (whose x once replaced the package's name in the names of the modules
    read later, so the rule saw no loop in river_onnx: issue 54)."""
    package = tmp_path / "river_loop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import c\nfrom .b import later\n")
    (package / "b.py").write_text("def later():\n    from .a import c\n    return c\n")
    (package / "c.py").write_text("")
    assert ["river_loop.a", "river_loop.b", "river_loop.a"] in circles("river_loop", package)


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_no_package_imports_another_packages_private_names(name):
    private = [f"{module}: {target}.{n}" for module, target, names in imports(name)
               if target.split(".")[0] in PACKAGES and target.split(".")[0] != name
               for n in [*names, *target.split(".")[1:]] if n.startswith("_")]
    assert not private


def test_the_core_exports_its_public_api_on_purpose():
    import river_core

    assert set(river_core.__all__) <= set(dir(river_core))
    for name in ("RiverModel", "ExitConfig", "Plan", "resolve", "Backend", "LayerEngine",
                 "KVCache", "ExitPolicy", "Needs", "RowView", "KVStrategy"):
        assert name in river_core.__all__


def test_the_base_install_needs_no_torch():
    """The core, the model package and the application import torch nowhere at import time:
    only the torch engines (and what they build) need it."""
    import subprocess
    import sys

    job = ("import sys, river_core, river_models, river_cli.main, river_conformance.plugin, "
           "river_conformance.fixtures.tiny, river_compute.skeleton; "
           "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.parametrize("engine", ["onnx", "ggml"])
def test_a_warm_cache_load_imports_neither_torch_nor_transformers(engine, tmp_path):
    """The onnx and ggml engines start from the cache without torch (2 s to import) or
    transformers (3-4 s): the cache holds the spec, the tokenizer and the engine's weights
    (onnx: the export; ggml: the user's GGUF and its stand-ins) (issues 41, 42)."""
    import os
    import subprocess
    import sys

    pytest.importorskip({"onnx": "onnxruntime", "ggml": "ggml"}[engine])
    if engine == "onnx":
        from river_conformance.fixtures import tiny
        model = str(tiny.save(tmp_path / "model"))
    else:
        from river_conformance.fixtures.tiny_gguf import gguf_file
        model = str(gguf_file(0, "llama3"))
    job = ("import sys; from river_core import RiverModel; "
           f"m = RiverModel.from_pretrained({model!r}, backend={engine!r}); "
           "m.generate('hi', max_new_tokens=2); "
           "print(sorted(m.backend.load_seconds), file=sys.stderr); "
           "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    env = {**os.environ, "RIVER_CACHE": str(tmp_path / "cache")}
    first, warm = (subprocess.run([sys.executable, "-c", job], capture_output=True, text=True,
                                  env=env) for _ in range(2))
    assert first.returncode == 0, first.stderr[-2000:]
    assert warm.stdout.strip() == "[]", warm.stderr[-2000:]
    # each phase of the load timed, for `river generate --json`
    phases = {"onnx": "['export', 'imports', 'sessions', 'tokenizer']",
              "ggml": "['backbone', 'imports', 'tokenizer']"}[engine]   # stand-ins: when run
    assert warm.stderr.strip().splitlines()[-1] == phases

