"""tools/tpu_capture.py runs only on a lent TPU machine, where a broken script costs device time:
it imports here, its damaged copies are built from a real TPU entry as the device run built them,
and its --help runs."""

from __future__ import annotations

import hashlib
import sys
from types import ModuleType

import pytest
import zstandard

from tests.support import tpu
from tests.support.caches import REPO
from tests.support.scripts import load_script

SCRIPT = REPO / "tools" / "tpu_capture.py"


def _tool() -> ModuleType:
    return load_script(SCRIPT)


def test_the_damaged_copies_are_what_the_device_run_loaded() -> None:
    """The same entry and seed give the same copies, byte for byte, as the ones JAX loaded on
    the TPU (the fixture keeps both): the oracle's copies are reproducible."""
    tool = _tool()
    (healthy,) = (tpu.unpacked() / "capture" / "variants" / "healthy").glob("jit_add-*-cache")
    seed = int(hashlib.sha256(b"jit_add").hexdigest()[:8], 16)
    made = {name: data for name, _what, data in tool.variants_of(healthy.read_bytes(), seed)}
    loaded = {
        v["name"].split(".", 1)[1]: v
        for v in tpu.damage_variants()
        if v["name"].startswith("jit_add.")
    }
    assert set(made) == set(loaded)
    for name, data in made.items():
        if name.startswith(("random-", "zstd-", "cut-")) or name.endswith("-first-tag"):
            assert data == loaded[name]["path"].read_bytes(), name
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(healthy.read_bytes())
    assert len(tool.chunks_of(raw)) == 7  # the header and libtpu's six messages


def test_help_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tool = _tool()
    monkeypatch.setattr(sys, "argv", ["tpu_capture.py", "--help"])
    with pytest.raises(SystemExit) as exited:
        tool.main()
    assert exited.value.code == 0 and "--steps" in capsys.readouterr().out
