"""Test modules never import each other (docs/architecture.md): what tests share lives in
``tests/support/`` or a ``conftest.py``, so a test file can move or go without breaking another.
Benchmarks and tools follow the same rule."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def imports_of_test_modules(root: Path = REPO) -> list[str]:
    """``file: module`` for each import of a ``tests`` module named ``test_*``."""
    found = []
    for folder in ("tests", "benchmarks", "tools"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:]):
                        found.append(f"{path.relative_to(root)}: {name}")
                        break
    return found


def test_no_test_module_imports_another() -> None:
    assert imports_of_test_modules() == []


def test_a_planted_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "tests" / "core").mkdir(parents=True)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tests" / "core" / "test_a.py").write_text("from tests.support import gold\n")
    assert imports_of_test_modules(tmp_path) == []
    (tmp_path / "benchmarks" / "b.py").write_text(
        "def f():\n    from tests.core.test_a import helper\n"
    )
    assert imports_of_test_modules(tmp_path) == ["benchmarks/b.py: tests.core.test_a"]
