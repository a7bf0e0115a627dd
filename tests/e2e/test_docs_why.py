"""docs/why.md's examples are what `why` and `preflight` print now, on real runs
(``tests/support/why_examples.py`` makes them; this runs each one and compares, scrubbed). One
test per example, so that the workers share them; the runs behind an example are shared with
``why``'s own tests (``keylog.shared_history``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support import why_examples
from tests.support.keylog import shared_history
from tests.support.sessioncache import SharedBuilds


def _page() -> str:
    import jax

    page = why_examples.page_block(why_examples.PAGE.read_text())
    shown = re.search(r"Real runs of jax (\S+) ", page)
    assert shown, "docs/why.md's examples do not say which JAX made them"
    if shown.group(1) != jax.__version__:
        pytest.skip(f"docs/why.md shows jax {shown.group(1)}'s output; this is {jax.__version__}")
    return page


def test_the_page_holds_the_examples_and_nothing_else() -> None:
    titles = re.findall(r"^### (.+)$", _page(), re.M)
    assert titles == [e.title for e in why_examples.EXAMPLES], (
        "docs/why.md's examples differ: python -m tests.support.why_examples --write"
    )


def test_a_key_that_is_all_digits_compares_as_a_key() -> None:
    """A run's 16-hex key can come out all digits (a full run met one): it is scrubbed as the
    key it is, not as a Python address (at most 15 digits), so the example still matches."""
    block = "jit_step  {}  2026-12-06 03:19:55 UTC  vm\n  vs 3839d99eef17f227 (in the cache)\n"
    page = block.format("8346c69990012c86")
    new = block.format("1234567890123456")
    assert why_examples.comparable(page) == why_examples.comparable(new)
    address = "backend_config: 140234567891234"
    assert "<ADDRESS>" in why_examples.comparable(address)


@pytest.mark.slow
@pytest.mark.parametrize("example", why_examples.EXAMPLES, ids=lambda e: e.title)
def test_each_example_is_what_the_code_prints_now(
    example: why_examples.Example, tmp_path: Path, shared_builds: SharedBuilds
) -> None:
    page = _page()
    from tests.support.caches import other_jax_python

    def history(
        runs: Sequence[dict[str, str]], hook: str | None, program: Path, first: str
    ) -> Path:
        cache, _ = shared_history(
            shared_builds, runs, hook=hook, program=program, first_python=first
        )
        return cache

    out = why_examples.run_example(example, tmp_path, other_jax_python, history)
    # the page's part for this example, scrubbed on its own as the new one is (the scrubber
    # numbers what it replaces in order)
    start = page.index(f"### {example.title}\n")
    end = page.find("\n### ", start + 1)
    shown = page[start : end if end >= 0 else page.index(why_examples.END) - 1]
    new = why_examples.example_block(example, out)
    assert why_examples.comparable(shown) == why_examples.comparable(new), (
        f"docs/why.md's example {example.title!r} differs: "
        "python -m tests.support.why_examples --write"
    )
