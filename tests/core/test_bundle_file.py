"""A bundle's header is checked whole before anything is staged: hostile or damaged headers are
one `cachedoctor: bundle:` line and exit 2, never an internal error, and nothing is written.
Hand-made bytes: these are the adversarial inputs no JAX program writes."""

from __future__ import annotations

import hashlib
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
    # Trust V: each of these was an internal error, or was taken as a bundle
    "packed_by a list": json.dumps({**GOOD, "packed_by": [1]}).encode(),
    "packed_by of numbers": json.dumps({**GOOD, "packed_by": {"jax": 0.1}}).encode(),
    "a source that is a number": json.dumps({**GOOD, "source": 7}).encode(),
    "an entry named twice": json.dumps({**GOOD, "entries": [_entry()["entries"][0]] * 2}).encode(),
    "a file named twice": json.dumps(
        {**GOOD, "files": [{"name": "cachedoctor-stats/r.json", "size": 1, "sha256": SHA}] * 2}
    ).encode(),
    "NaN": json.dumps({**GOOD, "created": float("nan")}).encode(),
    "Infinity": json.dumps({**GOOD, "created": float("inf")}).encode(),
    "a number of 5,000 digits": b'{"format": "cachedoctor-bundle/1", "entries": [], "files": [],'
    b' "created": ' + b"9" * 5000 + b"}",
}

ARGS = [(), ("--json",), ("--apply",), ("--apply", "--json")]


@pytest.mark.parametrize("args", ARGS, ids=" ".join)
@pytest.mark.parametrize("what", sorted(HEADERS))
def test_a_malformed_header_is_one_line_and_writes_nothing(
    tmp_path: Path, what: str, args: tuple[str, ...]
) -> None:
    bundle = _bundle(tmp_path / "b.tar", HEADERS[what])
    target = tmp_path / "target"
    code, out, err = invoke("unpack", *args, str(bundle), str(target))
    assert code == 2 and out == "", (out, err)
    assert err.startswith("cachedoctor: bundle:") and err.count("\n") == 1, err
    assert "internal-error" not in err and not target.exists()


@pytest.mark.parametrize("part", ["entries", "files"])
def test_a_member_named_twice_is_refused(tmp_path: Path, part: str) -> None:
    """Trust V: a header naming one member twice, the member there, was taken: the entry listed
    and counted twice, the record written once and counted once."""
    data = b"x"
    named = {"size": 1, "sha256": hashlib.sha256(data).hexdigest()}
    if part == "entries":
        member, header = f"entries/{KEY}-cache", {**GOOD, "entries": [{"key": KEY, **named}] * 2}
    else:
        member = "cachedoctor-stats/r.json"
        header = {**GOOD, "files": [{"name": member, **named}] * 2}
    bundle = _bundle(tmp_path / "b.tar", json.dumps(header).encode(), ((member, data),))
    code, out, err = invoke("unpack", "--apply", str(bundle), str(tmp_path / "t"))
    assert code == 2 and out == "", (out, err)
    assert err.startswith("cachedoctor: bundle:") and "twice" in err, err
    assert not (tmp_path / "t").exists()


def test_a_header_cut_short_is_one_line(tmp_path: Path) -> None:
    """Trust V: a bundle cut inside its header member was an internal error (tarfile's
    ReadError while the header was read)."""
    header = json.dumps({**GOOD, "source": "s" * 100_000}).encode()
    whole = _bundle(tmp_path / "whole.tar", header).read_bytes()
    for cut in (600, 5_000, 99_000):
        bundle = tmp_path / "cut.tar"
        bundle.write_bytes(whole[:cut])
        code, out, err = invoke("unpack", "--apply", str(bundle), str(tmp_path / "t"))
        assert code == 2 and err.startswith("cachedoctor: bundle:"), (cut, out, err)
        assert err.count("\n") == 1 and "internal-error" not in err, err


@pytest.mark.slow
def test_the_console_script_says_the_same_one_line(tmp_path: Path) -> None:
    """Each malformed header through ``python -m cachedoctor`` in a fresh process: one line,
    exit 2, nothing written."""
    from tests.support.cli import run_cli
    from tests.support.hookrun import base_env

    target = tmp_path / "target"
    for what, raw in sorted(HEADERS.items()):
        bundle = _bundle(tmp_path / "b.tar", raw)
        done = run_cli("unpack", "--apply", str(bundle), str(target), env=base_env(None))
        assert done.returncode == 2 and done.stdout == "", (what, done.stdout, done.stderr)
        assert done.stderr.startswith("cachedoctor: bundle:"), (what, done.stderr)
        assert done.stderr.count("\n") == 1, (what, done.stderr)
    assert not target.exists()


def test_what_the_header_says_is_shown_without_control_characters(tmp_path: Path) -> None:
    """Trust V: the header's source and module names went to the terminal as they were (an
    escape sequence in a bundle rewrote the screen; a lone surrogate was an internal error)."""
    data = b"x"
    header = {
        "format": GOOD["format"],
        "source": "/c\x1b[2J\ud800",
        "packed_by": {"jax": "0.10\x1b[31m"},
        "entries": [
            {
                "key": KEY,
                "module": "jit_\x07f",
                "size": 1,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        ],
        "files": [],
    }
    raw = json.dumps(header).encode()
    bundle = _bundle(tmp_path / "b.tar", raw, ((f"entries/{KEY}-cache", data),))
    code, out, err = invoke("unpack", str(bundle), str(tmp_path / "t"))
    assert code == 1 and err == "", (out, err)
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[2J" in out, out


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
