"""The installed jaxlib's option schema, kept on disk (``xla/schema_memo.py``): read once per
library, the same names every time, and never trusted when damaged or stale."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from cachedoctor.xla import optionschema, schema_memo
from tests.support.jaxlib_schema import message_class

pytest.importorskip("jaxlib")


SHIPPED = schema_memo.SHIPPED


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test starts with nothing kept, nothing shipped and nothing read in this process."""
    monkeypatch.setattr(schema_memo, "SHIPPED", tmp_path / "shipped-none")
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


def test_the_shipped_table_is_what_the_installed_library_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The oracle is the library itself: the table a fresh machine is served (no kept file, no
    read of the library) names every field as reading that library does."""
    library = optionschema.jaxlib_libraries()[0]
    digest = schema_memo.recorded_digest(library)
    assert digest is not None, "pip and uv write RECORD: the installed library must be named"
    if not (SHIPPED / f"{digest}.json.zst").is_file():
        pytest.skip(f"no table shipped for this platform's {library.name} (tools/ship_schemas.py)")
    read = _read_in_process()  # from the library: nothing shipped yet (the fixture)
    monkeypatch.setattr(schema_memo, "SHIPPED", SHIPPED)
    monkeypatch.setenv("XDG_CACHE_HOME", str(Path(os.environ["XDG_CACHE_HOME"]) / "fresh"))
    reads = _refuse_reading(monkeypatch)
    assert _read_in_process() == read
    assert not reads and not schema_memo.folder().exists()


def test_every_shipped_table_is_named_by_its_library() -> None:
    tables = sorted(SHIPPED.glob("*.json.zst"))
    assert tables, "the package ships tables (tools/ship_schemas.py)"
    for table in tables:
        doc = json.loads(zstandard.ZstdDecompressor().decompress(table.read_bytes()))
        assert doc["record"] == table.name.removesuffix(".json.zst")
        schema = optionschema._schema_of(doc)
        assert schema is not None and schema.source.startswith("jaxlib ")
        assert optionschema.DEBUG_OPTIONS in schema.messages


def _fake_install(root: Path, size_in_record: int, digest: str = "AbC_d-1") -> Path:
    library = root / "jaxlib" / "libfake.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"abc")
    (root / "jaxlib-9.9.dist-info").mkdir()
    (root / "jaxlib-9.9.dist-info" / "RECORD").write_text(
        f"jaxlib/__init__.py,sha256=x,1\njaxlib/libfake.so,sha256={digest},{size_in_record}\n"
    )
    return library


def _ship(folder: Path, doc: dict[str, object], name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = zstandard.ZstdCompressor().compress(json.dumps(doc).encode())
    (folder / f"{name}.json.zst").write_bytes(data)


def test_a_shipped_table_stands_only_for_the_bytes_its_record_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    read = _read_in_process()
    doc = {"format": schema_memo.FORMAT, "record": "AbC_d-1", **optionschema._doc_of(read)}
    shipped = tmp_path / "shipped"
    _ship(shipped, doc, "AbC_d-1")
    monkeypatch.setattr(schema_memo, "SHIPPED", shipped)
    library = _fake_install(tmp_path / "site", size_in_record=3)
    assert schema_memo.recorded_digest(library) == "AbC_d-1"
    assert optionschema._schema_of(schema_memo.shipped(library)) == read
    library.write_bytes(b"abcd")  # changed after install: RECORD no longer describes it
    assert schema_memo.recorded_digest(library) is None and schema_memo.shipped(library) is None
    other = _fake_install(tmp_path / "other", size_in_record=3, digest="../escape")
    assert schema_memo.shipped(other) is None
    unrecorded = _fake_install(tmp_path / "bare", size_in_record=3)
    (tmp_path / "bare" / "jaxlib-9.9.dist-info" / "RECORD").unlink()
    assert schema_memo.recorded_digest(unrecorded) is None
    for damage, name in (
        ({**doc, "record": "other"}, "AbC_d-1"),
        ({**doc, "format": "v0"}, "AbC_d-1"),
    ):
        _ship(shipped, damage, name)
        library.write_bytes(b"abc")
        assert schema_memo.shipped(library) is None
    (shipped / "AbC_d-1.json.zst").write_bytes(b"not zstd")
    assert schema_memo.shipped(library) is None


def test_a_fifo_named_like_a_record_or_a_kept_schema_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    """A FIFO would block ``open`` until a writer came: the reads give up at once instead."""
    import threading

    library = _fake_install(tmp_path / "site", size_in_record=3)
    record = tmp_path / "site" / "jaxlib-9.9.dist-info" / "RECORD"
    record.unlink()
    os.mkfifo(record)
    name = schema_memo.identity(library)
    assert name is not None
    schema_memo.folder().mkdir(parents=True)
    os.mkfifo(schema_memo.folder() / f"{name}.json")
    found: list[object] = []
    reader = threading.Thread(
        target=lambda: found.extend(
            [schema_memo.recorded_digest(library), schema_memo.load(library)]
        ),
        daemon=True,
    )
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "a read waited on a FIFO"
    assert found == [None, None]
