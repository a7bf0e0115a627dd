"""The size rule for modules (docs/development.md, "Size"): ``tools/check_docs.py`` fails on a
module in src/ over 600 lines that its ``LONG_MODULES`` does not name with a reason, and on an
entry there that no longer excuses anything. Checked on modules planted in a temporary tree of
known line counts, then on src/ itself.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.caches import REPO
from tests.support.scripts import load_script


@pytest.fixture(scope="module")
def check_docs() -> Iterator[types.ModuleType]:
    """tools/check_docs.py, imported as a module (it imports findings_doc from beside it)."""
    with pytest.MonkeyPatch.context() as m:
        m.syspath_prepend(str(REPO / "tools"))
        yield load_script(REPO / "tools" / "check_docs.py")


def plant(root: Path, name: str, lines: int) -> None:
    """A module of exactly ``lines`` lines (each ending in a newline, as ``wc -l`` counts)."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"X{n} = {n}\n" for n in range(lines)))


def test_a_module_over_600_lines_fails(check_docs, tmp_path: Path) -> None:
    plant(tmp_path, "pkg/big.py", 601)
    plant(tmp_path, "pkg/edge.py", 600)  # the limit itself is allowed
    plant(tmp_path, "small.py", 10)
    problems = list(check_docs.module_length_problems(tmp_path, {}))
    assert problems == [
        "pkg/big.py is 601 lines (over 600): split it along a seam, or say why it stays whole "
        "in LONG_MODULES (tools/check_docs.py)"
    ]


def test_a_long_module_passes_only_with_its_reason(check_docs, tmp_path: Path) -> None:
    plant(tmp_path, "pkg/big.py", 601)
    assert list(check_docs.module_length_problems(tmp_path, {"pkg/big.py": "one table"})) == []
    (blank,) = check_docs.module_length_problems(tmp_path, {"pkg/big.py": "  "})
    assert blank.startswith("pkg/big.py is 601 lines (over 600)")  # a reason is words
    (other,) = check_docs.module_length_problems(tmp_path, {"pkg/big.py": "x", "big.py": "x"})
    assert other.startswith("LONG_MODULES names big.py")  # the path under src/, not the name


def test_an_entry_that_excuses_nothing_fails(check_docs, tmp_path: Path) -> None:
    plant(tmp_path, "pkg/split.py", 600)
    allowed = {"pkg/split.py": "was long", "pkg/gone.py": "split in a branch"}
    assert list(check_docs.module_length_problems(tmp_path, allowed)) == [
        "LONG_MODULES names pkg/gone.py, which does not exist: remove its entry",
        "pkg/split.py is 600 lines, not over 600: remove its entry from LONG_MODULES",
    ]


def test_src_keeps_the_rule(check_docs) -> None:
    """The package as it is: every module over 600 lines has its reason, and every reason is
    still needed (a module split since fails here until its entry goes)."""
    assert check_docs.SRC == REPO / "src" / "cachedoctor"
    assert list(check_docs.module_length_problems()) == []
    for name, reason in check_docs.LONG_MODULES.items():
        lines = (check_docs.SRC / name).read_bytes().count(b"\n")
        assert lines > 600 and reason.strip(), name
