"""docs/openmetrics.md shows what `stats --format openmetrics` and `prometheus` print now, for
the cache `why`'s tests share (``tests/support/openmetrics_example.py``)."""

from __future__ import annotations

import pytest

from tests.support import openmetrics_example as example
from tests.support.keylog import shared_history
from tests.support.sessioncache import SharedBuilds


@pytest.mark.slow
def test_the_page_shows_what_the_code_prints_now(shared_builds: SharedBuilds) -> None:
    cache, _ = shared_history(shared_builds, example.RUNS)
    shown = example.page_block(example.PAGE.read_text())
    assert example.comparable(shown) == example.comparable(example.render(cache)), (
        "docs/openmetrics.md's examples differ: python -m tests.support.openmetrics_example --write"
    )


def test_what_is_scrubbed_is_only_what_varies() -> None:
    one = 'cachedoctor_cache_size_bytes{cache="/jaxcache"} 15102\ncachedoctor_x_total{a="b"} 0.25\n'
    other = (
        'cachedoctor_x_total{a="b"} 1.5e-05\ncachedoctor_cache_size_bytes{cache="/jaxcache"} 9\n'
    )
    assert example.comparable(one) == example.comparable(other)
    fewer = 'cachedoctor_cache_entries{cache="/jaxcache"} 4\n'
    assert example.comparable(fewer) != example.comparable(fewer.replace(" 4", " 5"))
