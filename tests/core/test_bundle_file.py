"""A bundle's header is checked whole before anything is staged: hostile or damaged headers are
one `cachedoctor: bundle:` line and exit 2, never an internal error, and nothing is written.
Hand-made bytes: these are the adversarial inputs no JAX program writes."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import invoke

GOOD = {"format": "cachedoctor-bundle/1", "entries": [], "files": []}
KEY = "jit_f-" + "a" * 64
SHA = "0" * 64


def _bundle(path: Path, header: bytes, members: tuple[tuple[str, bytes], ...] = ()) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in (("cachedoctor-bundle.json", header), *members):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _entry(**fields: Any) -> dict[str, Any]:
    return {
        "format": GOOD["format"],
        "entries": [{"key": KEY, "size": 1, "sha256": SHA, **fields}],
        "files": [],
    }


HEADERS: dict[str, bytes] = {
    "a list": json.dumps([1, 2]).encode(),
    "nested 200,000 deep": b"[" * 200_000 + b"]" * 200_000,
    "entries a string": json.dumps({**GOOD, "entries": "nope"}).encode(),
    "a size of 10**30": json.dumps(_entry(size=10**30)).encode(),
    "a negative size": json.dumps(_entry(size=-5)).encode(),
    "a size that is text": json.dumps(_entry(size="1")).encode(),
    "a size that is true": json.dumps(_entry(size=True)).encode(),
    "no sha256": json.dumps(_entry(sha256=None)).encode(),
    "an empty entry": json.dumps({**GOOD, "entries": [{}]}).encode(),
    "a file that is null": json.dumps({**GOOD, "files": [None]}).encode(),
    "a file outside the cache": json.dumps(
        {**GOOD, "files": [{"name": "../etc/passwd", "size": 1, "sha256": SHA}]}
    ).encode(),
    "a module that is a number": json.dumps(_entry(module=3)).encode(),
    "not JSON": b"\xff\xfe{",
}


@pytest.mark.parametrize("what", sorted(HEADERS))
def test_a_malformed_header_is_one_line_and_writes_nothing(tmp_path: Path, what: str) -> None:
    bundle = _bundle(tmp_path / "b.tar", HEADERS[what])
    target = tmp_path / "target"
    code, out, err = invoke("unpack", "--apply", str(bundle), str(target))
    assert code == 2, (out, err)
    assert err.startswith("cachedoctor: bundle:") and err.count("\n") == 1, err
    assert "internal-error" not in err and not target.exists()


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    header = json.dumps(_entry()).encode()
    bundle = tmp_path / "b.tar"
    with tarfile.open(bundle, "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("cachedoctor-bundle.json")
        info.size = len(header)
        tar.addfile(info, io.BytesIO(header))
        member = tarfile.TarInfo(f"entries/{KEY}-cache")
        member.size, member.type = 1, tarfile.GNUTYPE_SPARSE
        tar.addfile(member, io.BytesIO(b"x"))
    code, _, err = invoke("unpack", "--apply", str(bundle), str(tmp_path / "t"))
    assert code == 2 and "not the file its header describes" in err, err


def test_a_fifo_with_no_writer_is_refused_not_waited_on(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "b.tar"
    os.mkfifo(fifo)
    code, _, err = invoke("unpack", str(fifo), str(tmp_path / "t"))  # opening it would wait
    assert code == 2 and "not a regular file" in err, err


def test_pack_refuses_to_write_inside_the_cache_it_packs(tmp_path: Path) -> None:
    import shutil

    from tests.support import tpu

    cache = tmp_path / "cache"
    shutil.copytree(tpu.cache("shared/seed"), cache)
    before = sorted(p.name for p in cache.iterdir())
    for inside in (cache / "b.tar", cache / "sub" / "b.tar"):
        code, _, err = invoke("pack", str(cache), "-o", str(inside))
        assert code == 2 and "inside the cache it packs" in err, err
    assert sorted(p.name for p in cache.iterdir()) == before
