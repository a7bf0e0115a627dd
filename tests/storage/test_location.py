"""``storage/location.Location``: one parser for what the user typed, and what each place can do."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cachedoctor.errors import CachedoctorError
from cachedoctor.storage.location import Location

SRC = Path(__file__).resolve().parents[2] / "src" / "cachedoctor"


@pytest.mark.parametrize(
    ("typed", "spelling", "is_local"),
    [
        ("caches/sp", "caches/sp", True),  # relative: kept as typed (JAX hashes the spelling)
        ("caches/sp/", "caches/sp/", True),  # a trailing slash too: reports show what was typed
        ("./c", "./c", True),
        ("~/cache", "~/cache", True),  # not expanded: the shell does that, and JAX does not
        ("C:\\jax\\cache", "C:\\jax\\cache", True),  # a Windows-looking path is a path
        ("/abs/c", "/abs/c", True),
        ("gs://b", "gs://b", False),
        ("gs://b/", "gs://b", False),
        ("s3://b/p/", "s3://b/p", False),
        ("s3://b/p/q", "s3://b/p/q", False),
        (Path("rel/c"), "rel/c", True),  # os.PathLike
        ("file:///tmp/c", "/tmp/c", True),  # a file URL is its folder, as JAX's epath reads it
    ],
)
def test_parse_spellings(typed: str | Path, spelling: str, is_local: bool) -> None:
    loc = Location.parse(typed)
    assert (loc.spelling, loc.is_local) == (spelling, is_local)
    assert loc.display == str(loc) == spelling
    assert loc.local_path == (spelling if is_local else None)
    assert loc.url == (None if is_local else spelling)
    assert Location.parse(loc) is loc  # parsed once: a Location passes through


@pytest.mark.parametrize("typed", ["http://host/c", "ftp://x/y", "", "gs://", "file://"])
def test_parse_refuses_what_is_neither_folder_nor_bucket(typed: str) -> None:
    with pytest.raises(CachedoctorError) as info:
        Location.parse(typed)
    assert info.value.slug == "bad-url"
    assert "\n" not in str(info.value)


def test_of_setting_never_raises() -> None:
    assert Location.of_setting(None) is None and Location.of_setting("") is None
    assert Location.of_setting("ftp://x/y") is None
    assert Location.of_setting(3) is None
    assert Location.of_setting("gs://b/p/") == Location.parse("gs://b/p")


def test_capability_table() -> None:
    rows = {
        where: tuple(
            getattr(Location.parse(where), c)
            for c in ("can_rename", "has_locks", "has_modes", "has_atime")
        )
        for where in ("/c", "gs://b/p", "s3://b/p")
    }
    assert rows == {
        "/c": (True, True, True, True),
        "gs://b/p": (False, False, False, False),
        "s3://b/p": (False, False, False, False),
    }


def test_jax_spelling_children_and_parents() -> None:
    bucket = Location.parse("s3://b/p/")
    assert bucket.jax_spelling == "s3://b/p"
    assert bucket.subpath("xla_gpu_per_fusion_autotune_cache_dir") == (
        "s3://b/p/xla_gpu_per_fusion_autotune_cache_dir"
    )
    entry = bucket.child("jit_f-abc-cache")
    assert (entry.spelling, entry.name, entry.is_local) == (
        "s3://b/p/jit_f-abc-cache",
        "jit_f-abc-cache",
        False,
    )
    assert entry.parent == bucket
    assert Location.parse("gs://b").parent is None  # a bucket's root has no folder above it
    local = Location.parse("caches//sp/./")
    assert local.jax_spelling == "caches/sp"  # lexical, as JAX's Path spells it
    assert local.subpath("x") == "caches/sp/x"
    assert Location.parse("c/jit_f-1-cache").parent == Location.parse("c")
    assert Location.parse("jit_f-1-cache").parent == Location.parse(".")
    assert bucket.subcache_dir is not None and local.subcache_dir is None


def test_store_is_opened_once_and_only_on_demand(tmp_path: Path) -> None:
    loc = Location.parse(str(tmp_path))
    assert loc.store() is loc.store()
    assert loc.store().is_local
    assert Location.parse(str(tmp_path)) == loc  # the opened store is not part of equality


@pytest.mark.slow
def test_parse_imports_no_bucket_client() -> None:
    """The hook parses JAX's cache dir at start-up: a bucket URL must not import fsspec there."""
    code = (
        "import sys; from cachedoctor.storage.location import Location; "
        "l = Location.parse('gs://b/p'); l.jax_spelling; l.subcache_dir; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fsspec', 's3fs', 'gcsfs', 'concurrent') or m in "
        "('cachedoctor.storage.stores', 'cachedoctor.storage.fsops')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# Below the edge nothing tells a bucket from a folder by parsing: `is_url(` is called only in
# storage/ (urls, location, stores) and nowhere else.
IS_URL_ALLOWED = {"storage/urls.py", "storage/location.py", "storage/stores.py"}


def test_is_url_is_called_only_where_locations_are_made() -> None:
    callers = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if re.search(r"\bis_url\(", p.read_text(encoding="utf-8"))
    )
    assert [c for c in callers if c not in IS_URL_ALLOWED] == []
    assert (SRC / "storage" / "urls.py").is_file()


# Nor by a string test: `"://" in` / `"://" not in` only where a Location is made (storage/)
# and at the two edges that read a setting as it is spelled: JAX's config in the hook, the
# config file in settings.
SCHEME_TEST_ALLOWED = {"stablekeys/hook.py", "stablekeys/settings.py"}
_SCHEME_TEST = re.compile(r"""["']://["']\s+(not\s+)?in\b""")


def test_no_scheme_string_test_below_the_edge() -> None:
    callers = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if _SCHEME_TEST.search(p.read_text(encoding="utf-8"))
    )
    below = [c for c in callers if not c.startswith("storage/") and c not in SCHEME_TEST_ALLOWED]
    assert below == []
    assert "stablekeys/hook.py" in callers  # the pattern still finds the edge's own test


# Nor by parsing a path string again, or by asking `is_local` where a capability is meant:
# below the edge a Location is handed down, and asked what it can do (`can_rename`,
# `has_locks`, `has_modes`, `has_atime`), where it is (`local_path`, `url`) or for its folder
# (`open_dir`, `store`). `Location.parse(` is called only where what the user typed comes in
# (the CLI, the API, `core/where.py`) and in storage/; `.is_local` is read only there and on a
# Store (`Store.is_local`: the store tells an index it names a bucket), counted per module so a
# new one in an allowed module still fails.
EDGE = ("cli/", "storage/", "api.py", "core/where.py")
PARSE_ALLOWED: dict[str, int] = {}
IS_LOCAL_ALLOWED = {  # Store.is_local, not a Location's
    "cache/listdir.py": 2,  # list_cache(Store): a LocalStore lists as a folder; remote=
    "cache/record_index.py": 1,  # where the records' index lives for the store
    "cache/reader.py": 1,  # an object's version, asked of a remote store only
    "core/usage/records.py": 1,  # record_index.load(store.url, remote=...)
    "core/usage/fold.py": 1,  # the same, for the folded records
}


def _attribute_reads(tree: ast.AST) -> tuple[int, int]:
    """(calls of ``Location.parse``, reads of an attribute ``is_local``) in ``tree``."""
    parses = locals_ = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "is_local":
            locals_ += 1
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "parse"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "Location"
        ):
            parses += 1
    return parses, locals_


def below_the_edge_reparses(src: Path = SRC) -> list[str]:
    """``module: what`` for each module below the edge that parses a path string into a
    Location, or reads ``is_local``, beyond what the allow-lists grant."""
    found = []
    for path in sorted(src.rglob("*.py")):
        name = str(path.relative_to(src))
        if name.startswith(EDGE):
            continue
        parses, locals_ = _attribute_reads(ast.parse(path.read_text(encoding="utf-8")))
        if parses > PARSE_ALLOWED.get(name, 0):
            found.append(f"{name}: Location.parse( x{parses}")
        if locals_ > IS_LOCAL_ALLOWED.get(name, 0):
            found.append(f"{name}: .is_local x{locals_}")
    return found


def test_nothing_below_the_edge_parses_a_location_again_or_asks_is_local() -> None:
    assert below_the_edge_reparses() == []


def test_a_planted_reparse_or_is_local_fails(tmp_path: Path) -> None:
    """The check sees each kind of plant, in a module of its own and in an allowed one."""
    src = tmp_path / "cachedoctor"
    for rel in ("core/scan/run.py", "core/prune/apply.py", "cache/reader.py", "cli/scan.py"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text((SRC / rel).read_text(encoding="utf-8"), encoding="utf-8")
    assert below_the_edge_reparses(src) == []
    with (src / "core/prune/apply.py").open("a") as fh:
        fh.write("\n\ndef _planted(plan):\n    return Location.parse(str(plan.cache_dir))\n")
    with (src / "cache/reader.py").open("a") as fh:
        fh.write("\n\ndef _planted(where):\n    return where.is_local\n")
    with (src / "core/scan/run.py").open("a") as fh:
        fh.write("\n\ndef _planted(path):\n    return Location.parse(path)\n")
    with (src / "cli/scan.py").open("a") as fh:  # the edge may
        fh.write("\n\ndef _planted(path):\n    return Location.parse(path).is_local\n")
    assert below_the_edge_reparses(src) == [
        "cache/reader.py: .is_local x2",
        "core/prune/apply.py: Location.parse( x1",
        "core/scan/run.py: Location.parse( x1",
    ]
