"""docs/why.md's examples are what `why` and `preflight` print now, on real runs
(``tests/support/why_examples.py`` makes them; this runs it and compares, scrubbed)."""

from __future__ import annotations

import re

import pytest

from tests.support import why_examples


@pytest.mark.slow
def test_the_examples_of_docs_why_are_what_the_code_prints_now() -> None:
    import jax

    page = why_examples.page_block(why_examples.PAGE.read_text())
    shown = re.search(r"Real runs of jax (\S+) ", page)
    assert shown, "docs/why.md's examples do not say which JAX made them"
    if shown.group(1) != jax.__version__:
        pytest.skip(f"docs/why.md shows jax {shown.group(1)}'s output; this is {jax.__version__}")
    from tests.support.caches import other_jax_python

    new = why_examples.generate(other_jax_python)
    assert why_examples.comparable(page) == why_examples.comparable(new), (
        "docs/why.md's examples differ: python -m tests.support.why_examples --write"
    )
