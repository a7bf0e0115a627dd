"""`stats`' words (issue 54, "Text"): its help lists the parts in the order the output shows
them, and a first compile (JAX had no entry to read) is time spent, never called lost.

The cache: the plain program run twice with the stats hook; JAX's log says the first run
compiled every module and the second hit each one, so every miss the records count is a first
compile.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support.cli import invoke
from tests.support.hookrun import base_env, run_program
from tests.support.keylog import MODULE, hits, run_logged

pytestmark = pytest.mark.slow  # JAX in subprocesses

FAST_MATH = "--xla_cpu_enable_fast_math=true"
HIT = re.compile(r"Persistent compilation cache hit for '([^']+)'")
# each part of the text output: the words the help names it by, and the line that starts it
PARTS = {
    "totals": re.compile(r"^processes\s+\d"),
    "chart per day": re.compile(r"^hit rate per day"),
    "modules": re.compile(r"^modules \("),
    "hosts": re.compile(r"^hosts"),
    "findings": re.compile(r"^\d+ findings?$|^no findings"),
}


@pytest.fixture(scope="module")
def first_compiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("stats-words") / "cache"
    env = base_env(cache, CACHEDOCTOR_HOOK="stats", JAX_LOG_COMPILES="1")
    first = run_program("plain", cache, mode="none", env=env)
    assert not HIT.findall(first.stderr)  # the first run: every module compiled
    second = run_program("plain", cache, mode="none", env=env)
    assert {"jit_g", "jit_iota"} <= set(HIT.findall(second.stderr))  # then hit
    return cache


def test_help_names_the_parts_in_the_order_shown(first_compiles: Path) -> None:
    code, out, err = invoke("stats", str(first_compiles))
    assert code == 0, err
    lines = out.splitlines()
    shown = [
        next(i for i, line in enumerate(lines) if pattern.search(line))
        for pattern in PARTS.values()
    ]
    order_shown = [name for _, name in sorted(zip(shown, PARTS, strict=True))]
    code, helped, err = invoke("stats", "--help", env={"COLUMNS": "1000"})
    assert code == 0, err
    said = " ".join(helped.split())
    at = [said.find(name) for name in order_shown]
    assert -1 not in at, (order_shown, said)
    assert at == sorted(at), f"help says them in another order than shown {order_shown}: {said}"


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_a_first_compile_is_not_called_lost(first_compiles: Path, fmt: str, tmp_path: Path) -> None:
    if fmt == "html":
        page = tmp_path / "stats.html"
        code, _, err = invoke("stats", str(first_compiles), "--html", str(page))
        out = page.read_text()
    else:
        code, out, err = invoke("stats", str(first_compiles), "--format", fmt)
    assert code == 0, err
    assert "spent" in out
    assert "lost" not in out.lower(), out


class Cells(HTMLParser):
    """Each cell of ``<table id=modules>``: (row, column, class, inner HTML as text)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = False
        self.cells: list[tuple[int, int, str, str]] = []
        self.row = self.column = -1
        self.open: list[str] | None = None
        self.css = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.table = dict(attrs).get("id") == "modules"
        elif self.table and tag == "tr":
            self.row, self.column = self.row + 1, -1
        elif self.table and tag in ("td", "th"):
            self.column += 1
            self.css, self.open = dict(attrs).get("class") or "", []
        elif self.open is not None:
            self.open.append(f"<{tag}>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.table = False
        elif tag in ("td", "th") and self.open is not None:
            self.cells.append((self.row, self.column, self.css, "".join(self.open)))
            self.open = None
        elif self.open is not None:
            self.open.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if self.open is not None:
            self.open.append(data)


def test_the_html_why_column_is_left_aligned_and_shows_code_as_code(tmp_path: Path) -> None:
    """An XLA flag turned on between two runs: the module never hit, and "why it missed" gives
    the command that compares its keys, in a code span. On the page that column reads
    left-aligned, as words do, and the span is ``<code>``, not backticks (the column was
    right-aligned, backticks and all)."""
    cache = tmp_path / "cache"
    run_logged(cache)
    assert MODULE not in hits(run_logged(cache, env={"XLA_FLAGS": FAST_MATH}))  # JAX missed
    page = tmp_path / "stats.html"
    code, _, err = invoke("stats", str(cache), "--html", str(page))
    assert code == 0, err
    text = page.read_text()
    assert "`" not in text
    cells = Cells()
    cells.feed(text)
    header = {c: inner for r, c, _, inner in cells.cells if r == 0}
    why = next(c for c, inner in header.items() if inner == "why it missed")
    (row,) = [r for r, c, _, inner in cells.cells if c == 0 and inner == MODULE]
    (css, said) = next((css, inner) for r, c, css, inner in cells.cells if (r, c) == (row, why))
    assert re.search(r"<code>cachedoctor \w+ [^<]*</code>", said), said
    style = re.search(r"<style>(.*?)</style>", text, re.S)
    assert style is not None
    rules = {k.strip(): v for k, v in re.findall(r"([^{}]+)\{([^}]*)\}", style.group(1))}
    aligned = [sel for sel, body in rules.items() if "text-align:left" in body]
    assert css and any(f"td.{css}" in sel.split(",") for sel in aligned), (css, rules)
    if CHROMIUM:  # a browser's own cascade, where there is one: each cell's computed alignment
        shown = computed_alignment(text, tmp_path)
        assert shown[row][why] == "left" and shown[row][0] == "left", shown
        assert {shown[row][c] for c in range(1, why)} == {"right"}, shown  # the figures


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MEASURE = """<script>
for (const c of document.querySelectorAll("#modules tr > *"))
  c.setAttribute("data-align", getComputedStyle(c).textAlign);
</script></body>"""


def computed_alignment(page: str, tmp_path: Path) -> list[list[str]]:
    """Each cell's text-align in ``<table id=modules>`` as headless Chromium lays it out (a
    copy of the page with a script that writes it into the DOM), row by row."""
    copy = tmp_path / "measured.html"
    copy.write_text(page.replace("</body>", MEASURE))
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu"]
    argv += [f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", copy.as_uri()]
    dom = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout
    table = dom[dom.index('id="modules"') :].split("</table>")[0]
    return [re.findall(r'data-align="(\w+)"', row) for row in table.split("<tr")[1:]]
