"""Gold files: the text a command prints, with what differs between runs and machines scrubbed.

``tests/e2e/test_gold.py`` compares each command's output with ``tests/gold/NAME.txt``, or with
``tests/gold/jax-<version>/NAME.txt`` where a JAX release prints something else (none does
today: jax 0.10.2 and 0.12.0.1 give the same files); ``pytest tests/e2e/test_gold.py
--update-gold`` (or ``CACHEDOCTOR_UPDATE_GOLD=1``) rewrites the file compared. What is scrubbed,
and nothing else:

- the paths a test names (the cache, the interpreter) and the temp folder, each as a
  placeholder; the random part of a temp folder cachedoctor makes (``cachedoctor-check-<R>``);
- the installed jax and jaxlib versions, the host name;
- dates and clock times; durations (a number before ``s``, ``ms`` or ``min``); numbers with a
  fraction (sizes such as ``7.3 KiB`` keep their unit, seconds in tables); byte counts
  (``18974 bytes``): entry sizes differ between CPUs; whole seconds in a table's last column
  headed ``compile s`` (a compile on a loaded machine rounds to 1 s instead of 0 s);
- hashes: each 64-digit hex key hash becomes ``<K1>``, ``<K2>``… in order of first appearance,
  a shorter hex prefix of one the same label, any other run of 8 or more hex digits
  with a digit in it (a digest prefix, a per-run pointer) ``<X1>``…;
- layout: runs of spaces and of table rules are collapsed, trailing spaces dropped, so that a
  longer path or size does not move every column.

Labels keep identity: an output that names the same key twice, or two different keys, still
says so after scrubbing. Words, counts, percentages, module names, verdicts, units and exit
statuses are compared as they are.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import tempfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

UPDATE_ENV = "CACHEDOCTOR_UPDATE_GOLD"
GOLD_ROOT = Path(__file__).resolve().parents[1] / "gold"

_KEY_HASH = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
_HEX = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{8,63}(?![0-9A-Za-z_])")
_BYTES = re.compile(r"(?<![\w.])\d+ bytes\b")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_CLOCK = re.compile(r"\b\d{2}:\d{2}(:\d{2})?\b")
# an age as units.format_age words it ("42 s", "5 minutes", "3 hours"), before ago/after
_AGE = re.compile(r"(?<![\w.])\d+ (?:s|minutes|hours|days)(?= (?:ago|after)\b)")
_DURATION = re.compile(r"(?<![\w.])-?\d+(\.\d+)? ?(s|ms|min)\b")
_FRACTION = re.compile(r"(?<![\w.])-?\d+\.\d+(?![\w.])")
_CHECK_TEMP = re.compile(r"cachedoctor-(check|demo)-[A-Za-z0-9_]+")
_SPACES = re.compile(r" {2,}")
_RULES = re.compile(r"([━─═])\1{2,}")


def gold_path(name: str) -> Path:
    """The gold file ``name`` of the installed JAX: its release's own, if it has one."""
    own = GOLD_ROOT / f"jax-{metadata.version('jax')}" / f"{name}.txt"
    return own if own.exists() else GOLD_ROOT / f"{name}.txt"


def scrub(text: str, paths: Mapping[str, str]) -> str:
    """``text`` with what varies between runs replaced (see the module docstring); ``paths``
    maps each real path (a string or a ``Path``'s text) to its placeholder."""
    paths = {**paths, tempfile.gettempdir(): "<TMPDIR>"}
    for real, placeholder in sorted(paths.items(), key=lambda p: -len(p[0])):
        text = text.replace(real, placeholder)
        resolved = os.path.realpath(real)
        if resolved != real:
            text = text.replace(resolved, placeholder)
    text = _CHECK_TEMP.sub(lambda m: f"cachedoctor-{m.group(1)}-<R>", text)
    jax, jaxlib = metadata.version("jax"), metadata.version("jaxlib")
    for version, placeholder in (
        (jaxlib, "<JAX>" if jaxlib == jax else "<JAXLIB>"),
        (jax, "<JAX>"),
    ):
        text = re.sub(rf"(?<![\w.]){re.escape(version)}(?![\w.])", placeholder, text)
    host = socket.gethostname()
    for name in {host, host.split(".")[0]}:
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", "<HOST>", text)
    text = _labelled_hashes(text)
    text = _BYTES.sub("<N> bytes", text)
    text = _DATE.sub("<DATE>", text)
    text = _CLOCK.sub("<TIME>", text)
    text = _AGE.sub("<AGE>", text)
    text = _DURATION.sub(lambda m: "<T>" + (" " if " " in m.group(0) else "") + m.group(2), text)
    text = _FRACTION.sub("<N>", text)
    lines = [_RULES.sub(r"\1\1\1", _SPACES.sub("  ", line)).rstrip() for line in text.split("\n")]
    return "\n".join(_time_ordered_rows(_compile_seconds(lines)))


def _time_ordered_rows(lines: list[str]) -> list[str]:
    """The rows of a table ordered by compile time spent (``stats``' modules), sorted by name:
    which of two modules took longer to compile depends on the machine's load."""
    out: list[str] = []
    rows: list[str] = []
    state = "out"  # "title", then "rows" after the header's rule
    for line in lines:
        if state == "out" and "most compile time spent on misses first" in line:
            state = "title"
        elif state == "title" and line.lstrip().startswith("━"):
            state = "rows"
        elif state == "rows" and "│" in line:
            rows.append(line)
            continue
        elif state == "rows":
            out += sorted(rows)
            rows, state = [], "out"
        out.append(line)
    return out + sorted(rows)


def _compile_seconds(lines: list[str]) -> list[str]:
    """The whole seconds of a ``compile s`` column (the last one) as ``<T>``: how long XLA took
    depends on the machine's load, not on what the cache holds."""
    out: list[str] = []
    in_table = False
    for line in lines:
        if line.rstrip().endswith("compile s"):
            in_table = True
        elif in_table and "│" in line:
            line = re.sub(r"│  \d+$", "│  <T>", line)
        elif in_table and not line.startswith("━"):
            in_table = False
        out.append(line)
    return out


def _labelled_hashes(text: str) -> str:
    keys: dict[str, str] = {}
    for found in _KEY_HASH.finditer(text):
        keys.setdefault(found.group(0), f"<K{len(keys) + 1}>")
    text = _KEY_HASH.sub(lambda m: keys[m.group(0)], text)
    others: dict[str, str] = {}

    def short(m: re.Match[str]) -> str:
        run = m.group(0)
        if not any(c.isdigit() for c in run):
            return run  # a word made of the letters a-f ("defaced")
        for full, label in keys.items():
            if full.startswith(run):
                return label  # the ellipsis that follows stays
        return others.setdefault(run, f"<X{len(others) + 1}>")

    return _HEX.sub(short, text)


def compare(name: str, got: str, *, update: bool) -> str | None:
    """None when ``got`` equals the gold file ``name`` (written first when ``update``); else
    what differs, as a unified diff, with the command that regenerates the files."""
    path = gold_path(name)
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        return None
    if not path.exists():
        return f"no gold file {path}: {REGENERATE}"
    want = path.read_text()
    if want == got:
        return None
    diff = difflib.unified_diff(
        want.splitlines(),
        got.splitlines(),
        f"gold/{path.parent.name}/{path.name}",
        "now",
        lineterm="",
    )
    return "\n".join(diff) + f"\n(if the change is meant: {REGENERATE})"


REGENERATE = "pytest tests/e2e/test_gold.py --update-gold"
