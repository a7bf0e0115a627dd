"""Per-test outcomes of JUnit XML reports, compared with the first: exit 1 when any differs.

python tools/compare_junit.py plain.xml stable.xml observe.xml stats.xml

``nox -s jaxtests`` uses it: JAX's own tests run plain and with the hook in each mode, and the
hook must change no test's outcome (passed, failure, error or skipped), nor which tests ran.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def outcomes(path: str) -> dict[str, str]:
    """``classname::name`` -> passed | failure | error | skipped."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = child.tag
        out[f"{case.get('classname')}::{case.get('name')}"] = kind
    return out


def compare(base: str, *others: str) -> int:
    plain = outcomes(base)
    if not plain:
        print(f"{base}: no test ran", file=sys.stderr)
        return 1
    status = 0
    for other in others:
        got = outcomes(other)
        differ = sorted(n for n in set(plain) | set(got) if plain.get(n) != got.get(n))
        print(f"{other}: {len(got)} tests, {len(differ)} outcomes differ from {base}")
        for name in differ:
            print(f"  {name}: {plain.get(name, 'absent')} -> {got.get(name, 'absent')}")
        status |= bool(differ)
    return status


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(compare(*sys.argv[1:]))
