"""The installed jaxlib's option schema, kept on disk (``xla/schema_memo.py``): read once per
library, the same names every time, and never trusted when damaged or stale."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachedoctor.xla import optionschema, schema_memo
from tests.support.jaxlib_schema import message_class

pytest.importorskip("jaxlib")


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test starts with nothing kept and nothing read in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(schema_memo.DISABLE_ENV, raising=False)
    monkeypatch.delenv("CACHEDOCTOR_NO_JAXLIB_SCHEMA", raising=False)
    optionschema._installed_schema_cached.cache_clear()
    yield
    optionschema._installed_schema_cached.cache_clear()


def _read_in_process() -> optionschema.Schema:
    optionschema._installed_schema_cached.cache_clear()
    found = optionschema.installed_schema()
    assert found is not None, "jaxlib is installed: its schema must be read"
    return found


def _refuse_reading(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count (and forbid) reads of the library itself: a kept schema needs none."""
    reads: list[str] = []

    def read_descriptors(library: object, *args: object) -> object:
        reads.append(str(library))
        raise AssertionError("the library was read although its schema is kept")

    monkeypatch.setattr(optionschema, "read_descriptors", read_descriptors)
    return reads


def test_a_kept_schema_names_every_field_as_jaxlib_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle is protobuf's own descriptor of jaxlib's DebugOptions and compile options."""
    read = _read_in_process()
    assert list(schema_memo.folder().glob("*.json")), "the first read keeps the schema"
    _refuse_reading(monkeypatch)
    kept = _read_in_process()
    assert kept == read
    for proto_file, message in (
        ("xla/xla.proto", optionschema.DEBUG_OPTIONS),
        ("xla/xla.proto", optionschema.MODULE_CONFIG),
    ):
        descriptor = message_class(proto_file, message).DESCRIPTOR
        expected = {f.number: f.name for f in descriptor.fields}
        info = kept.messages[message]
        assert {n: f.name for n, f in info.fields.items()} == expected


def test_a_damaged_or_foreign_file_is_read_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    read = _read_in_process()
    (kept,) = schema_memo.folder().glob("*.json")
    for damage in (b"", b"{", b'{"format": "other"}', kept.read_bytes()[:-40], b"[1, 2]"):
        kept.write_bytes(damage)
        assert _read_in_process() == read  # read from the library again, and kept anew
        assert kept.read_bytes() != damage
    # a valid document of another library (renamed into this one's place) is not trusted
    doc = kept.read_text().replace('"library":"', '"library":"0', 1)
    kept.write_text(doc)
    reads: list[object] = []
    original = optionschema.read_descriptors

    def counted(library: Path, *args: tuple[str, ...]) -> object:
        reads.append(library)
        return original(library, *args)

    monkeypatch.setattr(optionschema, "read_descriptors", counted)
    assert _read_in_process() == read
    assert reads, "a file naming another library must not stand for this one"


def test_an_upgraded_jaxlib_is_read_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's size, mtime and inode name its kept file: another build is another file."""
    _read_in_process()
    library = optionschema.jaxlib_libraries()[0]
    before = schema_memo.identity(library)
    st = os.stat(library)
    real_stat = os.stat

    def newer(path: object, *args: object, **kwargs: object) -> os.stat_result:
        found = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        if os.path.realpath(str(path)) != os.path.realpath(library):
            return found
        fields = list(found)
        fields[8] = st.st_mtime + 10  # st_mtime
        return os.stat_result(fields, {"st_mtime_ns": st.st_mtime_ns + 10**10})

    monkeypatch.setattr(os, "stat", newer)
    assert schema_memo.identity(library) != before
    assert schema_memo.load(library) is None


def test_off_and_unwritable_cost_nothing_but_the_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(schema_memo.DISABLE_ENV, "1")
    read = _read_in_process()
    assert not schema_memo.folder().exists()
    monkeypatch.delenv(schema_memo.DISABLE_ENV)
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # mkdir fails under a file
    assert _read_in_process() == read
