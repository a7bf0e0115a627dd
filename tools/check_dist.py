"""What the sdist and the wheel must hold (``nox -s wheel``): a release is buildable, testable
and complete from the sdist alone, and the wheel carries the start-up hook and the license.

python tools/check_dist.py dist/cachedoctor-X.tar.gz dist/cachedoctor-X-py3-none-any.whl
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDIST_NEEDS = [
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "action.yml",
    "noxfile.py",
    "src/cachedoctor/__init__.py",
    "src/cachedoctor_startup.pth",
    "tests/conftest.py",
    "tests/e2e/test_trust.py",
    "docs/commands.md",
    "tools/check_docs.py",
]
WHEEL_NEEDS = ["cachedoctor/__init__.py", "cachedoctor_startup.pth", "cachedoctor/programs/seed.py"]


def version() -> str:
    text = (ROOT / "src" / "cachedoctor" / "_version.py").read_text()
    found = re.search(r'__version__ = "([^"]+)"', text)
    assert found, "no __version__ in _version.py"
    return found.group(1)


def problems(sdist: Path, wheel: Path) -> list[str]:
    out = []
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    out += [f"sdist lacks {n}" for n in SDIST_NEEDS if n not in names]
    with zipfile.ZipFile(wheel) as whl:
        files = set(whl.namelist())
        meta_name = next(n for n in files if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(whl.read(meta_name).decode())
    out += [f"wheel lacks {n}" for n in WHEEL_NEEDS if n not in files]
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in files):
        out.append("wheel lacks its LICENSE")
    if meta["Version"] != version():
        out.append(f"wheel version {meta['Version']} is not _version.py's {version()}")
    required = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    if not any(r.startswith("filelock") for r in required):
        out.append("filelock is not a dependency (JAX's LRU eviction needs it)")
    if meta["License-Expression"] != "Apache-2.0":
        out.append(f"License-Expression is {meta['License-Expression']!r}")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    found = problems(Path(sys.argv[1]), Path(sys.argv[2]))
    for line in found:
        print(f"check_dist: {line}", file=sys.stderr)
    print(f"check_dist: {len(found)} problems in {sys.argv[1]} and {sys.argv[2]}")
    sys.exit(1 if found else 0)
