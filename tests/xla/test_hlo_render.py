"""`show --hlo` renders a module with jaxlib in a child process whose memory is capped: jaxlib
sizes its tables by the largest id and count a module holds, so a damaged or hostile module can
make it allocate gigabytes. Over the cap, the text is refused, and the refusal says why."""

from __future__ import annotations

import pytest

from cachedoctor.cache import reader
from cachedoctor.cache.model import EntryDetail
from tests.support import tpu

pytestmark = pytest.mark.slow  # the renderer is a child process


def _module() -> bytes:
    (path,) = tpu.cache("capture/moved").glob("jit_step-*-cache")
    detail = reader.decode_entry(path, detail=True)
    assert isinstance(detail, EntryDetail) and detail.hlo_module is not None
    return detail.hlo_module


def test_a_module_renders_within_the_cap() -> None:
    from cachedoctor.xla import hlo

    rendered = hlo.render_hlo(_module())
    assert rendered.refused is None and rendered.text is not None
    assert "ENTRY" in rendered.text and "tanh" in rendered.text


def test_over_the_cap_it_is_refused_and_says_why() -> None:
    """A cap too small for jaxlib to work in stands for a module that needs more than the real
    cap: the child stops at the limit, nothing grows in this process, and the words say so."""
    from cachedoctor.xla import hlo

    rendered = hlo.render_hlo(_module(), memory_cap=8 << 20)
    assert rendered.text is None and rendered.refused is not None
    assert rendered.refused.startswith("refused: jaxlib would need more than")
    assert "largest id and count" in rendered.refused
