"""cachedoctor's commands on real TPU caches (tests/fixtures/tpu-v5e), with what JAX did there
as the oracle: every entry JAX loaded is kept, every command reads them, and the Pallas kernels
that jax 0.10 recompiled when their source moved are found and explained.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cachedoctor.storage.location import Location
from tests.support import tpu
from tests.support.cli import invoke


@pytest.fixture
def moved(tmp_path: Path) -> Path:
    """The capture's ``moved`` cache: one program run from folder a, from b, from a with a line
    added above the kernels, from a again (all hits), from a with the add kernel changed."""
    target = tmp_path / "moved"
    shutil.copytree(tpu.cache("capture/moved"), target)
    return target


def _key(folder: Path, module: str, run: str) -> str:
    """The key JAX missed (and wrote) for ``module`` in capture run ``run``."""
    runs = tpu.capture_results()["moved"]["runs"]
    (key,) = [k for kind, m, k in runs[run]["outcomes"] if kind == "miss" and m == module]
    assert (folder / f"{key}-cache").exists()
    return str(key)


def test_scan_reads_every_entry_and_names_the_moved_kernels(moved: Path) -> None:
    code, out, err = invoke("scan", "--json", str(moved))
    assert code == 0, err
    doc = json.loads(out)
    assert {e["platform"] for e in doc["entries"]} == {"tpu"}
    assert all(e["ok"] and e["tpu"]["chip"] == "TPU v5 lite" for e in doc["entries"])
    found = {f["module"]: f for f in doc["findings"] if f["kind"] == "kernel-locations"}
    assert set(found) == {"jit_add", "jit_matmul"}
    add = found["jit_add"]
    # a, b and a-comment: JAX missed each (its log), and they differ only in debug locations;
    # a-body changed the kernel and is not among them
    expected = {_key(moved, "jit_add", r) for r in ("a", "b", "a-comment")}
    assert set(add["entries"]) == expected
    assert _key(moved, "jit_add", "a-body") not in add["entries"]
    assert "add_kernel" in add["message"]
    for place in (
        "progs/a/capture_prog.py:32",
        "progs/b/capture_prog.py:32",
        "progs/a/capture_prog.py:33",
    ):
        assert place in add["message"], add["message"]
    assert "hashes a kernel's source path" in add["advice"]
    assert not [f for f in doc["findings"] if f["kind"] in ("corrupt", "unreadable")]


def test_diff_says_the_kernel_moved_and_where(moved: Path) -> None:
    a = moved / f"{_key(moved, 'jit_add', 'a')}-cache"
    b = moved / f"{_key(moved, 'jit_add', 'b')}-cache"
    lower = moved / f"{_key(moved, 'jit_add', 'a-comment')}-cache"
    changed = moved / f"{_key(moved, 'jit_add', 'a-body')}-cache"
    code, out, _ = invoke("diff", str(a), str(b))
    assert code == 0
    assert out.startswith(
        "verdict: same program: differs only in the debug locations of Mosaic kernel "
        "`add_kernel`: /tmp/tpucap/progs/a/capture_prog.py:32 → "
        "/tmp/tpucap/progs/b/capture_prog.py:32"
    ), out[:300]
    assert "the compiled TPU program (libtpu's core program) is byte-identical" in out
    code, out, _ = invoke("diff", str(a), str(lower))
    assert code == 0 and "capture_prog.py:32 → /tmp/tpucap/progs/a/capture_prog.py:33" in out
    code, out, _ = invoke("diff", "--json", str(a), str(changed))
    doc = json.loads(out)
    assert code == 1 and doc["verdict"]["kind"] == "different-program"
    assert "body of Mosaic kernel `add_kernel` differs" in doc["verdict"]["line"]
    (pair,) = doc["kernels"]["pairs"]
    assert pair["same_stripped"] is False and pair["name"] == "add_kernel"


@pytest.mark.slow  # show --hlo renders in a child process (xla/hlo.render_hlo)
def test_show_lists_each_kernel_with_its_grid_and_locations(moved: Path) -> None:
    entry = moved / f"{_key(moved, 'jit_matmul', 'b')}-cache"
    code, out, _ = invoke("show", "--json", str(entry))
    assert code == 0
    doc = json.loads(out)
    assert doc["entry"]["platform"] == "tpu" and doc["entry"]["tpu"]["chip_variant"] == "lite"
    (kernel,) = doc["kernels"]
    assert kernel["name"] == "mm_kernel" and kernel["grid"] == [2, 2, 2]  # 512 / 256 per axis
    assert any(
        loc.startswith("/tmp/tpucap/progs/b/capture_prog.py:") for loc in kernel["locations"]
    )
    code, out, _ = invoke("show", "--hlo", str(entry))
    assert code == 0 and "HLO (before optimisation)" in out and "custom-call" in out
    assert "mm_kernel" in out and "2×2×2" in out


@pytest.mark.parametrize("name", ["shared/seed", "shared/hook", "shared/mix", "capture/moved"])
def test_lint_passes_healthy_tpu_caches(name: str, tmp_path: Path) -> None:
    """Before, lint failed CI on any TPU cache (every entry 'corrupt')."""
    folder = tmp_path / "c"
    shutil.copytree(tpu.cache(name), folder)
    code, out, err = invoke("lint", str(folder))
    assert code == 0, out + err


def test_prune_corrupt_removes_only_what_jax_failed_to_load(tmp_path: Path) -> None:
    folder, variants = tpu.damaged_cache(tmp_path)
    healthy = {p.name for p in folder.glob("*-cache")} - {f"{k}-cache" for k in variants}
    code, _, err = invoke("prune", "--corrupt", "--apply", "--json", str(folder))
    assert code in (0, 1), err
    left = {p.name for p in folder.glob("*-cache")}
    removed = {k for k in variants if f"{k}-cache" not in left}
    assert healthy <= left  # every entry JAX hit stays
    for key in removed:
        assert variants[key]["jax"] == "error", variants[key]["name"]
    named = {
        k
        for k, v in variants.items()
        if v["jax"] == "error"
        and not str(v["name"]).split(".")[1].startswith(("random-", "zstd-silent-"))
    }
    assert named <= removed  # cut, zstd-rejected, broken messages, leftover bytes: all gone
    kept_failing = {k for k, v in variants.items() if v["jax"] == "error"} - removed
    assert len(kept_failing) <= 12  # deep inside libtpu's own messages: kept (docs/format-tpu.md)


def test_an_unknown_layout_is_info_and_kept_by_every_command(tmp_path: Path) -> None:
    folder, key = tpu.unknown_layout_entry(tmp_path)
    code, out, _ = invoke("scan", "--json", str(folder))
    doc = json.loads(out)
    (finding,) = [f for f in doc["findings"] if key in f["entries"]]
    assert (finding["kind"], finding["severity"]) == ("unknown-layout", "info") and code == 0
    code, out, err = invoke("lint", str(folder))
    assert code == 0, out + err
    code, out, _ = invoke("prune", "--corrupt", "--apply", str(folder))
    assert (folder / f"{key}-cache").exists()
    bundle = tmp_path / "b.tar"
    code, out, err = invoke("pack", str(folder), "-o", str(bundle))
    assert code == 0, err
    assert "3 entries" in out.splitlines()[0] and "left out" not in out, out


def test_the_hook_made_one_entry_per_kernel_on_the_tpu(tmp_path: Path) -> None:
    """What the stable hook did on the TPU (jax 0.10.2): the program run from folder a, from b
    and a line lower shared one entry per kernel and hit; the changed kernel missed, and its
    result is the new body's. Each entry's key is recomputed offline from its manifest."""
    from cachedoctor.stablekeys import manifest, splithash

    runs = tpu.verify_results()["moved-stable"]["runs"]
    for name in ("b", "a-comment", "a-again"):
        assert {kind for kind, _, _ in runs[name]["outcomes"]} == {"hit"}, name
    missed = [m for kind, m, _ in runs["a-body"]["outcomes"] if kind == "miss"]
    assert missed == ["jit_add"]
    assert runs["a-body"]["results"]["add"] != runs["a"]["results"]["add"]  # never stale
    folder = tmp_path / "stable"
    shutil.copytree(tpu.cache("verify/moved-stable"), folder)
    by_module: dict[str, int] = {}
    for path in folder.glob("*-cache"):
        module = path.name.split("-", 1)[0]
        by_module[module] = by_module.get(module, 0) + 1
    assert by_module["jit_matmul"] == 1 and by_module["jit_add"] == 2  # a's, and a-body's
    found = list(manifest.iter_manifests(Location.local(str(folder))))
    assert {m.key for m in found} == {p.name[: -len("-cache")] for p in folder.glob("*-cache")}
    for m in found:
        assert m.mode == "stable"
        pairs = [(c["name"], c["digest"]) for c in m.components]
        assert m.key.rsplit("-", 1)[1] == splithash.combine(pairs, m.hasher_version)
        if m.module_name in ("jit_add", "jit_matmul"):  # the strip, as recorded on the TPU
            assert any(v["field"] == "tpu_custom_call[0].body" for v in m.volatile)
    code, out, _ = invoke("scan", "--json", str(folder))
    assert code == 0
    assert not [f for f in json.loads(out)["findings"] if f["kind"] == "kernel-locations"]


def test_why_names_the_kernel_that_moved(tmp_path: Path) -> None:
    """Stats records of runs from folder a and then from b: `why` explains each Pallas
    kernel's miss by the lines its source moved from and to, read from the entries."""
    folder = tmp_path / "cmd"
    shutil.copytree(tpu.cache("verify/cmd"), folder)
    code, out, err = invoke("why", "--json", str(folder))
    assert code == 0, err
    doc = json.loads(out)
    said: dict[str, list[str]] = {}
    for m in doc["misses"]:
        if m["verdict"] == "changed":
            said.setdefault(m["module"], []).append(m["words"])
    for module, kernel, line in (("jit_add", "add_kernel", 38), ("jit_matmul", "mm_kernel", 49)):
        a, b = (f"/tmp/tpucap/progs/{f}/capture_prog.py:{line}" for f in "ab")
        moved = f"differs only in the debug locations of Mosaic kernel `{kernel}`: {a} → {b}"
        assert any(moved in words for words in said[module]), said[module]


@pytest.mark.parametrize(
    "args",
    [("scan",), ("scan", "--json"), ("lint",), ("stats",), ("preflight",), ("pack", "-o", "B")],
)
def test_read_only_runs_write_nothing_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """Trust IV: under CACHEDOCTOR_READ_ONLY (the Action's read-only: true) the inspectors wrote
    their index into the cache (cachedoctor-index/); now the cache's files, names and times are
    as they were, and the index goes to the user cache dir."""
    folder = tmp_path / "mix"
    shutil.copytree(tpu.cache("shared/mix"), folder)
    argv = [str(tmp_path / "b.tar") if a == "B" else a for a in args]

    def state() -> dict[str, tuple[int, int]]:
        return {
            str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")
        }

    before = state()
    monkeypatch.setenv("CACHEDOCTOR_INDEX_IN_CACHE", "1")  # as outside the tests (conftest)
    monkeypatch.setenv("CACHEDOCTOR_READ_ONLY", "1")
    code, _, err = invoke(*argv[:1], str(folder), *argv[1:])
    assert code in (0, 1), err
    assert state() == before, set(state()) ^ set(before)
    monkeypatch.delenv("CACHEDOCTOR_READ_ONLY")
    invoke("scan", str(folder))  # the premise: without it, the index does go into the cache
    assert (folder / "cachedoctor-index").is_dir()


def test_unpack_writes_manifests_only_beside_its_entries_and_carries_records(
    tmp_path: Path,
) -> None:
    """Trust IV: unpack wrote every manifest of the bundle, also for entries it did not write
    (there already, or written by another unpack meanwhile): manifests without an entry. Now a
    manifest goes only beside an entry this unpack wrote, the stats records travel with the
    bundle, and a second unpack into the same target writes nothing."""
    source = tmp_path / "hook"
    shutil.copytree(tpu.cache("shared/hook"), source)
    bundle = tmp_path / "b.tar"
    code, _, err = invoke("pack", str(source), "-o", str(bundle))
    assert code == 0, err
    target = tmp_path / "target"
    target.mkdir()
    (present,) = source.glob("jit_iota-*-cache")
    shutil.copy(present, target / present.name)  # one entry there already (not by this unpack)
    code, out, err = invoke("unpack", "--apply", "--json", str(bundle), str(target))
    doc = json.loads(out)
    written = {e["key"] for e in doc["entries"] if e["action"] == "written"}
    assert written and present.name[: -len("-cache")] not in written, doc["entries"]
    manifests = {p.name[: -len(".json")] for p in (target / "cachedoctor-manifests").glob("*.json")}
    assert manifests == written  # none for the entry it found there
    records = sorted(p.name for p in (target / "cachedoctor-stats").glob("*.json"))
    assert records == sorted(p.name for p in (source / "cachedoctor-stats").glob("*.json"))
    assert doc["records"] == len(records) and doc["companions"] == len(written)
    _, again, _ = invoke("unpack", "--apply", "--json", str(bundle), str(target))
    second = json.loads(again)
    assert {e["action"] for e in second["entries"]} == {"present"}
    assert second["companions"] == 0 and second["records"] == 0


def test_pack_takes_only_records_that_are_records(tmp_path: Path) -> None:
    """Trust IV: pack took whatever cachedoctor-stats/ held: an earlier bundle saved there, a
    file hard-linked into it from outside the cache. Now only what parses as a record."""
    source = tmp_path / "mix"
    shutil.copytree(tpu.cache("shared/mix"), source)
    stats = source / "cachedoctor-stats"
    real = sorted(p.name for p in stats.glob("*.json"))
    first = tmp_path / "first.tar"
    assert invoke("pack", str(source), "-o", str(first))[0] == 0
    shutil.copy(first, stats / "old-bundle.json")  # an earlier bundle, named like a record
    outside = tmp_path / "secret.json"
    outside.write_text((stats / real[0]).read_text())  # a record's bytes, someone else's file
    os.link(outside, stats / "20261207T000000-elsewhere-1-deadbeef.json")
    bundle = tmp_path / "b.tar"
    code, _, err = invoke("pack", "--json", str(source), "-o", str(bundle))
    assert code == 0, err
    import tarfile

    with tarfile.open(bundle) as tar:
        packed = sorted(
            m.name.split("/", 1)[1] for m in tar if m.name.startswith("cachedoctor-stats/")
        )
    assert packed == real


def test_stats_never_shows_a_negative_saving(tmp_path: Path) -> None:
    """Trust IV: where reads cost more than the whole-second compile times JAX kept (the TPU
    runs compiled in under a second), the hosts table showed "-0.05" saved."""
    folder = tmp_path / "cmd"
    shutil.copytree(tpu.cache("verify/cmd"), folder)
    code, out, err = invoke("stats", str(folder))
    assert code == 0, err
    assert "reads cost" in out  # the premise: the summed saving is negative
    assert " -0." not in out and " -1" not in out, out


def test_unpack_says_when_relocated_entries_were_not_moved(tmp_path: Path) -> None:
    """Trust IV: when JAX's lock was held, the relocated entries silently stayed under their
    written keys (which JAX misses at the new path). Now the report says which, and why."""
    import filelock

    source = tmp_path / "obs"
    shutil.copytree(tpu.cache("verify/obs"), source)  # observe-mode manifests, another path
    bundle = tmp_path / "b.tar"
    assert invoke("pack", str(source), "-o", str(bundle))[0] == 0
    target = tmp_path / "target"
    target.mkdir()
    held = filelock.FileLock(str(target / ".lockfile"))
    with held:
        _, out, err = invoke(
            "unpack", "--apply", "--json", "--lock-timeout", "0.1s", str(bundle), str(target)
        )
    doc = json.loads(out)
    written = [e for e in doc["entries"] if e["action"] == "written"]
    assert written and doc["moved"] == [], err
    said = [n for n in doc["notes"] if "was not moved to its stable key" in n]
    assert len(said) == len(written), doc["notes"]


def test_unpack_never_promises_a_hit_over_a_damaged_entry(tmp_path: Path) -> None:
    """Trust IV: the target held a damaged copy of an entry at the same key; unpack wrote
    nothing over it (as it must) and still said "will hit": JAX fails on the damaged file and
    never replaces it. Now that entry is a miss, and the words say what to do."""
    source = tmp_path / "hook"
    shutil.copytree(tpu.cache("shared/hook"), source)
    bundle = tmp_path / "b.tar"
    assert invoke("pack", str(source), "-o", str(bundle))[0] == 0
    target = tmp_path / "target"
    target.mkdir()
    (entry,) = source.glob("jit_f-*-cache")
    (target / entry.name).write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    _, out, _ = invoke("unpack", "--json", str(bundle), str(target))
    doc = json.loads(out)
    (there,) = [e for e in doc["entries"] if e["key"] == entry.name[: -len("-cache")]]
    assert there["action"] == "present" and there["verdict"] == "miss", there
    assert "damaged entry at this key" in there["words"]
