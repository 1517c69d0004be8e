"""The layering rule (docs/architecture.md): the core imports no adapter, no backend imports
another, and the model package and the kit import no backend."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {p.name: p for p in [*ROOT.glob("river_*"), *(ROOT / "adapters").glob("river_*"),
                                *(ROOT / "plugins").glob("river_*")] if (p / "__init__.py").is_file()}
BACKENDS = {"river_hf", "river_onnx", "river_llamacpp"}
ALLOWED = {
    "river_core": set(),
    "river_models": {"river_core"},
    "river_conformance": {"river_core", "river_models"},
    "river_policies": {"river_core"},
    **{b: {"river_core", "river_models"} for b in BACKENDS},
}


def imported_packages(package: Path) -> set[str]:
    found = set()
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name in PACKAGES} - {package.name}


def test_every_package_is_covered_by_the_rule():
    assert set(PACKAGES) == set(ALLOWED)


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_package_imports_only_what_the_layering_allows(name):
    assert imported_packages(PACKAGES[name]) <= ALLOWED[name]
