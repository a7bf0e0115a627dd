"""`cachedoctor unpack` against what can go wrong once it writes (issue 54, "Bundles"): a write
that fails midway is said and the rest is written, with nothing left half-written under a JAX
key name; an entry that does not decode is never written as an entry (JAX's own verdict on
each damaged copy of a real TPU entry is the oracle); links are never counted as entries.

Real JAX caches (the TPU fixtures: tests/fixtures/tpu-v5e) for every bundle; the failures are
injected at the file system's edge (a full disk), since none can be made for real without root.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from cachedoctor import layout
from tests.support import tpu
from tests.support.cli import invoke


def _packed(tmp_path: Path, source: Path, *args: str) -> tuple[Path, dict[str, Any]]:
    """``source`` packed (``args``: pack's options), and the bundle's header."""
    bundle = tmp_path / f"{source.name}.tar"
    code, _, err = invoke("pack", str(source), "-o", str(bundle), *args)
    assert code == 0, err
    with tarfile.open(bundle) as tar:
        header = json.loads(tar.extractfile("cachedoctor-bundle.json").read())  # type: ignore[union-attr]
    return bundle, header


def _sound(target: Path, source: Path) -> None:
    """Nothing half-written: every entry the source's bytes, every -atime file and manifest
    beside its entry, no temp file left."""
    names = {p.name for p in target.iterdir()}
    entries = {n[: -len("-cache")] for n in names if n.endswith("-cache")}
    for key in entries:
        assert (target / f"{key}-cache").read_bytes() == (source / f"{key}-cache").read_bytes()
    atimes = {n[: -len("-atime")] for n in names if n.endswith("-atime")}
    assert atimes <= entries, atimes - entries
    manifests = target / layout.MANIFEST_DIRNAME
    keys = (
        {p.name[: -len(".json")] for p in manifests.glob("*.json")} if manifests.is_dir() else set()
    )
    assert keys <= entries, keys - entries
    assert not [p for p in target.rglob("*") if p.name.startswith(".cachedoctor-tmp")]


def _fails_at(monkeypatch: pytest.MonkeyPatch, victim: str, code: int) -> None:
    """Writing ``victim`` into the target fails with ``code``: its temp file is written whole,
    then syncing it fails (ENOSPC: the disk filled up; EACCES: a permission, which root, who
    runs these tests in CI's containers, would not meet for real)."""
    from cachedoctor.storage import fsops, local_store

    real_write, real_temp = local_store.LocalStore.write_atomic, fsops.CacheDir._write_temp
    writing: list[str] = []

    def write_atomic(self: Any, name: str, data: Any, **kwargs: Any) -> None:
        writing.append(name)
        try:
            real_write(self, name, data, **kwargs)
        finally:
            writing.pop()

    def write_temp(self: Any, tmp: str, data: Any, mode: int, **kwargs: Any) -> None:
        real_temp(self, tmp, data, mode, **kwargs)
        if writing and writing[-1] == victim:
            raise OSError(code, os.strerror(code))

    monkeypatch.setattr(local_store.LocalStore, "write_atomic", write_atomic)
    monkeypatch.setattr(fsops.CacheDir, "_write_temp", write_temp)


@pytest.mark.parametrize(
    ("fails", "code"),
    [
        ("entry", errno.ENOSPC),
        ("manifest", errno.ENOSPC),
        ("record", errno.ENOSPC),
        ("entry", errno.EACCES),
        ("manifest", errno.EACCES),
    ],
)
def test_a_write_that_fails_midway_is_said_and_the_rest_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str, code: int
) -> None:
    """Trust V: after a first write, a full disk while writing a key manifest or a stats record
    was an error line (exit 2) that hid what had been written, and an entry that failed left
    its -atime file behind (an -atime file with no entry). Now the report says each file
    written and each that failed, exit 1, and nothing stays half-written."""
    source = tmp_path / "hook"
    shutil.copytree(tpu.cache("shared/hook"), source)
    bundle, header = _packed(tmp_path, source)
    first, second = (e["key"] for e in header["entries"])
    records = sorted(
        f["name"] for f in header["files"] if f["name"].startswith("cachedoctor-stats")
    )
    victim = {
        "entry": f"{second}-cache",  # the second entry: the first is written by then
        "manifest": f"{layout.MANIFEST_DIRNAME}/{first}.json",  # beside the first entry
        "record": records[0],  # after both entries and their manifests
    }[fails]
    _fails_at(monkeypatch, victim, code)
    said = {errno.ENOSPC: "no space left on device", errno.EACCES: "permission denied"}[code]
    for as_json in (True, False):
        target = tmp_path / f"target-{as_json}"
        target.mkdir()
        (target / layout.LOCKFILE).touch()  # JAX's LRU runs here: -atime files go first
        args = ("--json",) if as_json else ()
        status, out, err = invoke("unpack", "--apply", *args, str(bundle), str(target))
        assert status == 1 and err == "", (out, err)
        _sound(target, source)
        if not as_json:
            assert said in out.lower() and "dry run" not in out, out
            continue
        doc = json.loads(out)
        actions = {e["key"]: e["action"] for e in doc["entries"]}
        if fails == "entry":
            assert actions[first] == "written" and actions[second].startswith("failed: "), actions
            assert said in actions[second].lower(), actions
            assert not (target / f"{second}-atime").exists()  # taken back with its entry
            assert doc["failed_files"] == []
        else:
            assert set(actions.values()) == {"written"}, actions
            assert [f["name"] for f in doc["failed_files"]] == [victim]
            assert not (target / victim).exists()
        written = sorted(p.name for p in target.glob("*-cache"))
        assert written == sorted(f"{k}-cache" for k, a in actions.items() if a == "written")
        manifests = list((target / layout.MANIFEST_DIRNAME).glob("*.json"))
        assert doc["companions"] == len(manifests)
        assert doc["records"] == len(list((target / "cachedoctor-stats").glob("*.json")))
        assert doc["atime_files"] == len(list(target.glob("*-atime"))) == len(written)


def test_a_member_that_fails_its_digest_midway_writes_nothing(tmp_path: Path) -> None:
    """Every member is checked before the first write: the second entry's bytes changed in the
    middle of the bundle (the first is sound) is one line, exit 2, and the target stays empty.
    (So it was before this work too: staging came first already.)"""
    source = tmp_path / "hook"
    shutil.copytree(tpu.cache("shared/hook"), source)
    bundle, header = _packed(tmp_path, source)
    second = header["entries"][1]["key"]
    with tarfile.open(bundle) as tar:
        member = tar.getmember(f"entries/{second}-cache")
    raw = bytearray(bundle.read_bytes())
    raw[member.offset_data + member.size // 2] ^= 0xFF
    bundle.write_bytes(bytes(raw))
    target = tmp_path / "target"
    target.mkdir()
    status, out, err = invoke("unpack", "--apply", str(bundle), str(target))
    assert status == 2 and out == "" and "differ from its digest" in err, (out, err)
    assert err.count("\n") == 1 and list(target.iterdir()) == []


def test_an_entry_jax_fails_to_load_is_not_written(tmp_path: Path) -> None:
    """Every damaged copy of two real TPU entries, packed with --include damaged: unpack writes
    none that does not decode (scan's `corrupt`), and each it refuses is one JAX failed to load
    on the TPU; every copy JAX loaded is written, and so is an entry in a layout the reader does
    not know (no verdict: JAX may load it)."""
    folder, variants = tpu.damaged_cache(tmp_path)
    future, unknown = tpu.unknown_layout_entry(tmp_path)
    shutil.copy(future / f"{unknown}-cache", folder / f"{unknown}-cache")
    healthy = {p.name[: -len("-cache")] for p in folder.glob("*-cache")} - set(variants)
    bundle, header = _packed(tmp_path, folder, "--include", "damaged")
    assert {e["key"] for e in header["entries"]} == healthy | set(variants)
    target = tmp_path / "target"
    code, out, err = invoke("unpack", "--apply", "--json", str(bundle), str(target))
    assert code == 1, (out, err)  # some entry will not hit: those not written
    doc = json.loads(out)
    by_action: dict[str, set[str]] = {}
    for e in doc["entries"]:
        by_action.setdefault(e["action"], set()).add(e["key"])
        if e["action"] == "refused":
            assert e["verdict"] == "miss" and "does not decode" in e["words"], e
    refused, written = by_action.pop("refused"), by_action.pop("written")
    assert not by_action, by_action
    for key in refused:
        assert variants[key]["jax"] == "error", variants[key]["name"]  # JAX failed on each
        assert not (target / f"{key}-cache").exists()
    assert healthy | {k for k, v in variants.items() if v["jax"] == "hit"} <= written
    assert unknown in written
    named = {  # cut, zstd-rejected, broken messages, leftover bytes (as prune --corrupt)
        k
        for k, v in variants.items()
        if v["jax"] == "error"
        and not str(v["name"]).split(".")[1].startswith(("random-", "zstd-silent-"))
    }
    assert named <= refused
    code, out, _ = invoke("scan", "--json", str(target))
    assert "corrupt" not in {f["kind"] for f in json.loads(out)["findings"]}


def test_zstd_garbage_matching_its_digest_is_refused_and_said(tmp_path: Path) -> None:
    """A member whose bytes match its digest but are no JAX entry (a zstd frame of text): not
    written under its -cache name, said in the dry run and the applied run alike."""
    import zstandard

    source = tmp_path / "seed"
    shutil.copytree(tpu.cache("shared/seed"), source)
    garbage = "jit_g-" + "e" * 64
    (source / f"{garbage}-cache").write_bytes(
        zstandard.ZstdCompressor().compress(b"not an executable " * 64)
    )
    bundle, _ = _packed(tmp_path, source, "--include", "damaged")
    target = tmp_path / "target"
    for args in ((), ("--apply",)):
        code, out, err = invoke("unpack", *args, str(bundle), str(target))
        assert code == 1, (out, err)
        (line,) = [x for x in out.splitlines() if "jit_g" in x]
        assert "refused" in line and "does not decode" in line, out
        assert "1 refused" in out.splitlines()[-1], out
    assert not (target / f"{garbage}-cache").exists()
    assert len(list(target.glob("*-cache"))) == 2


def test_links_are_never_counted_as_entries(tmp_path: Path) -> None:
    """Trust V: pack counted a symbolic link named -cache as a damaged entry it left out, and
    unpack counted a link standing at a bundle's key as the entry "there already". Now pack
    names links apart, unpack calls the key blocked (never followed, never replaced), and the
    dry run and the applied run each say only their own words."""
    source, outside = tmp_path / "seed", tmp_path / "outside"
    shutil.copytree(tpu.cache("shared/seed"), source)
    outside.write_bytes(b"not in the cache")
    link = "jit_zz-" + "a" * 64
    (source / f"{link}-cache").symlink_to(outside)
    bundle = tmp_path / "b.tar"
    code, out, err = invoke("pack", "--json", str(source), "-o", str(bundle))
    assert code == 0, err
    packed = json.loads(out)
    assert packed["links"] == [link] and packed["left_out"] == [] and len(packed["entries"]) == 2
    code, out, _ = invoke("pack", "--force", str(source), "-o", str(bundle))
    assert "left out" not in out and "1 symbolic link" in out, out

    (source / f"{link}-cache").unlink()
    first, second = sorted(e["key"] for e in packed["entries"])
    target = tmp_path / "target"
    target.mkdir()
    (target / f"{first}-cache").symlink_to(outside)
    for apply in (False, True):
        args = ("--apply",) if apply else ()
        _, out, _ = invoke("unpack", "--json", *args, str(bundle), str(target))
        actions = {e["key"]: e["action"] for e in json.loads(out)["entries"]}
        assert actions == {first: "blocked", second: "written" if apply else "write"}
        code, text, _ = invoke("unpack", *args, str(bundle), str(target))
        assert "1 blocked by a link" in text, text
        if apply:  # the second run finds the entry the first wrote (the link is no entry)
            assert "dry run" not in text and "would" not in text and "1 there already" in text
            assert " write " not in text, text
        else:
            assert "dry run: would write 1 entry" in text and "wrote" not in text, text
            assert "there already" not in text, text
    assert os.readlink(target / f"{first}-cache") == str(outside)  # never replaced
    assert outside.read_bytes() == b"not in the cache"
