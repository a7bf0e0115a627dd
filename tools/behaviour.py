"""Record what every command does on JAX-built caches, to compare two versions of cachedoctor.

A refactor ("House" issues) must leave behaviour byte for byte as it was: every command's
``--json`` and text, its exit status and its one-line errors, on a folder and on buckets. This
tool records that with one checkout's interpreter and compares two records::

    python tools/behaviour.py build DIR              # JAX writes the caches once (a few minutes)
    python tools/behaviour.py record DIR before.json --python /old/checkout/.venv/bin/python
    python tools/behaviour.py record DIR after.json  --python .venv/bin/python
    python tools/behaviour.py compare before.json after.json

Each case runs on a fresh copy of the built cache at the same path (times kept), with a fresh
user cache dir (no scan memo carried over) and the local S3 and GCS servers of the tests for
the bucket cases, so two records differ only where the code does. What varies between two runs
of the same code (ages, clock times, a check's temp folder) is scrubbed as the gold files scrub
it (``tests/support/gold.scrub``). ``record`` twice with one interpreter must compare equal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (name, argv, whether the case changes the cache: it gets a copy of its own)
Case = tuple[str, list[str], bool]

SELECTORS = [
    ["--older-than", "1d"],
    ["--older-than", "0s"],
    ["--max-size", "1KiB"],
    ["--duplicates"],
    ["--orphans"],
    ["--corrupt"],
    ["--relocated"],
    ["--stale-jax"],
    ["--repair"],
    ["--module", "jit_*", "--older-than", "0s"],
    ["--older-than", "0s", "--duplicates"],
]


def folder_cases() -> list[Case]:
    cases: list[Case] = [
        ("scan", ["scan", "{C}"], False),
        ("scan-json", ["scan", "{C}", "--json"], False),
        ("scan-fail-on", ["scan", "{C}", "--fail-on", "info", "--max-modules", "1"], False),
        ("lint-json", ["lint", "{C}", "--format", "json"], False),
        ("lint-junit", ["lint", "{C}", "--format", "junit"], False),
        ("lint-github", ["lint", "{C}", "--format", "github"], False),
        ("stats", ["stats", "{C}"], False),
        ("stats-json", ["stats", "{C}", "--json"], False),
        ("diff-json", ["diff", "{K1}", "{K2}", "--dir", "{C}", "--json"], False),
        ("diff", ["diff", "{K1}", "{K2}", "--dir", "{C}"], False),
        ("diff-module", ["diff", "--module", "jit_f", "--dir", "{C}", "--json"], False),
        ("show", ["show", "{K1}", "--dir", "{C}"], False),
        ("show-json", ["show", "{K1}", "--dir", "{C}", "--json"], False),
        ("rekey-json", ["rekey", "{C}", "--json"], False),
        ("rekey-relocated", ["rekey", "{C}", "--relocated", "--json"], False),
        ("status-json", ["status", "--json"], False),
    ]
    for sel in SELECTORS:
        name = "prune" + "".join(s if s.startswith("-") else f"={s}" for s in sel)
        cases.append((name, ["prune", "{C}", *sel, "--json"], False))
        cases.append((name + "-text", ["prune", "{C}", *sel], False))
    cases += [
        ("prune-apply", ["prune", "{C}", "--older-than", "0s", "--apply", "--json"], True),
        ("prune-dup-apply", ["prune", "{C}", "--duplicates", "--apply"], True),
        ("rekey-apply", ["rekey", "{C}", "--apply", "--json"], True),
        ("stats-zero-apply", ["stats", "{C}", "--zero", "--apply"], True),
    ]
    return cases


def bucket_cases(scheme: str) -> list[Case]:
    u = "{" + scheme.upper() + "}"
    return [
        (f"{scheme}-scan-json", ["scan", u, "--json"], False),
        (f"{scheme}-scan", ["scan", u], False),
        (f"{scheme}-lint", ["lint", u, "--format", "json"], False),
        (f"{scheme}-stats", ["stats", u, "--json"], False),
        (f"{scheme}-prune", ["prune", u, "--older-than", "0s", "--json"], False),
        (f"{scheme}-prune-dup", ["prune", u, "--duplicates"], False),
        (f"{scheme}-diff", ["diff", "--module", "jit_f", "--dir", u, "--json"], False),
        (f"{scheme}-missing", ["scan", u + "-no-such-prefix", "--json"], False),
    ]


ERROR_CASES: list[Case] = [
    ("err-no-dir", ["scan", "{D}/no-such-dir"], False),
    ("err-file", ["scan", "{D}/a-file"], False),
    ("err-loop", ["scan", "{D}/loop"], False),
    ("err-scheme", ["scan", "ftp://host/cache"], False),
    ("err-months", ["prune", "{C}", "--older-than", "6m"], False),
    ("err-size", ["prune", "{C}", "--max-size", "800M"], False),
    ("err-no-selector", ["prune", "{C}"], False),
    ("err-home", ["prune", "{D}/home", "--older-than", "0s", "--apply"], False),
    ("err-diff-keys", ["diff", "nope-1", "nope-2", "--dir", "{C}"], False),
    ("err-show-key", ["show", "jit_nope-" + "0" * 64, "--dir", "{C}"], False),
    ("err-corrupt", ["scan", "{D}/corrupt", "--json"], False),
    ("err-no-bucket", ["scan", "s3://no-such-bucket/cache"], False),
]


def build(root: Path) -> None:
    """JAX writes the cache: the seed program (a custom_partitioning op) and the others teams
    mix, plain, with the hook in each mode and with JAX's LRU, with stats records."""
    from tests.support import hookrun

    cache = root / "cache"
    cache.mkdir(parents=True, exist_ok=False)
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    for mode in ("none", "none", "observe", "stable", "stable"):
        hookrun.run_program("seed", cache, mode=mode, env=hookrun.base_env(cache, **env))
    hookrun.run_recorded(cache, "stats")
    lru = {"JAX_COMPILATION_CACHE_MAX_SIZE": str(1 << 30)}
    hookrun.run_recorded(cache, "stats", **lru)
    print(f"built {cache}: {len(list(cache.iterdir()))} names")


def _fixtures(work: Path) -> None:
    """The hand-made inputs of the error cases (no cache content: bad input only)."""
    (work / "a-file").write_text("not a folder\n")
    with contextlib.suppress(FileExistsError):
        os.symlink("loop", work / "loop")
    home = work / "home"
    home.mkdir()
    (home / f"jit_f-{'ab' * 32}-cache").write_bytes(b"my notes\n" * 40)
    corrupt = work / "corrupt"
    corrupt.mkdir()
    (corrupt / f"jit_f-{'cd' * 32}-cache").write_bytes(b"\x28\xb5\x2f\xfd" * 9)


def _keys(cache: Path) -> tuple[str, str]:
    names = sorted(
        (p.stat().st_mtime_ns, p.name[: -len("-cache")])
        for p in cache.iterdir()
        if p.name.startswith("jit_f-") and p.name.endswith("-cache")
    )
    return names[0][1], names[1][1]


def _copy(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=shutil.copy2, symlinks=True)


@contextlib.contextmanager
def _buckets(cache: Path) -> Iterator[dict[str, str]]:
    from tests.support.buckets import running_servers

    from cachedoctor.storage import stores

    with running_servers() as servers:
        urls = {s: servers.url(s, "behaviour/cache") for s in ("s3", "gs")}
        for url in urls.values():  # the files (the GCS emulator takes no empty upload)
            store = stores.open_store(url)
            for path in sorted(cache.iterdir()):
                if path.is_file() and path.stat().st_size:
                    store.write_atomic(path.name, path.read_bytes())
        yield {"S3": urls["s3"], "GS": urls["gs"], **{"env": json.dumps(servers.env)}}


def record(root: Path, out: Path, python: str) -> None:
    work = root / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    _fixtures(work)
    k1, k2 = _keys(root / "cache")
    results: dict[str, dict[str, object]] = {}
    with _buckets(root / "cache") as urls:
        bucket_env = json.loads(urls.pop("env"))
        cases = folder_cases() + bucket_cases("s3") + bucket_cases("gs") + ERROR_CASES
        for i, (name, argv, changes) in enumerate(cases):
            cache = work / "cache"
            if changes or i == 0 or not cache.exists():
                _copy(root / "cache", cache)
            fields = {"C": str(cache), "D": str(work), "K1": k1, "K2": k2, **urls}
            args = [a.format(**fields) for a in argv]
            userdir = work / "user-cache"
            shutil.rmtree(userdir, ignore_errors=True)
            env = {
                **{
                    k: v
                    for k, v in os.environ.items()
                    if not k.startswith(("JAX_", "CACHEDOCTOR_"))
                },
                **bucket_env,
                "COLUMNS": "1000",
                "XDG_CACHE_HOME": str(userdir),
                "CACHEDOCTOR_CONFIG": str(work / "no-config.toml"),
                "JAX_COMPILATION_CACHE_DIR": str(cache),
                "JAX_PLATFORMS": "cpu",
            }
            proc = subprocess.run(
                [python, "-m", "cachedoctor", *args],
                capture_output=True,
                text=True,
                env=env,
                cwd=work,
                timeout=600,
                check=False,
            )
            after = sorted(p.name for p in cache.iterdir()) if changes else None
            results[name] = {
                "argv": argv,
                "exit": proc.returncode,
                "stdout": proc.stdout,
                "stderr": proc.stderr,
                "left": after,
            }
            print(f"{name}: exit {proc.returncode}", flush=True)
    doc = {"root": str(root), "python": python, "cases": results}
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _outside_env() -> dict[str, str]:
    """This environment without JAX's and cachedoctor's own variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "CACHEDOCTOR_"))}


# what differs between two runs of the same code beyond what the gold files scrub: the time a
# report was made, an inode number (a fresh copy), a compact time stamp in a file name
_VARYING = [
    (re.compile(r'"(created_at|scanned_at|generated_at|now)": [0-9.e+]+'), r'"\1": <NOW>'),
    (re.compile(r'"ino": \d+'), '"ino": <INO>'),
    (re.compile(r"\b\d{8}T\d{6}Z?\b"), "<STAMP>"),
]


def _scrub(text: object, paths: dict[str, str]) -> object:
    from tests.support import gold

    if not isinstance(text, str):
        return text
    for pattern, replacement in _VARYING:
        text = pattern.sub(replacement, text)
    return gold.scrub(text, paths)


def _scrubbed(path: Path) -> dict[str, dict[str, object]]:
    """The record's cases, scrubbed; the checkout of its interpreter (``CO/.venv/bin/python``)
    and this one are placeholders too: two checkouts differ there by name only."""
    doc = json.loads(path.read_text())
    paths = {doc["root"]: "<ROOT>", str(REPO): "<CHECKOUT>"}  # REPO's programs built the cache
    python = Path(doc["python"])
    if len(python.parents) > 2:
        paths[str(python.parents[2])] = "<CHECKOUT>"
    return {
        name: {field: _scrub(value, paths) for field, value in case.items()}
        for name, case in doc["cases"].items()
    }


def compare(a: Path, b: Path) -> int:
    left, right = _scrubbed(a), _scrubbed(b)
    differ = 0
    for name in sorted(set(left) | set(right)):
        if left.get(name) != right.get(name):
            differ += 1
            print(f"== {name} differs")
            for field in ("exit", "stdout", "stderr", "left"):
                x = (left.get(name) or {}).get(field)
                y = (right.get(name) or {}).get(field)
                if x != y:
                    import difflib

                    lines = difflib.unified_diff(
                        str(x).splitlines(), str(y).splitlines(), a.name, b.name, lineterm=""
                    )
                    print(f"-- {field}\n" + "\n".join(list(lines)[:40]))
    print(f"{len(left)} cases, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("build").add_argument("dir", type=Path)
    rec = sub.add_parser("record")
    rec.add_argument("dir", type=Path)
    rec.add_argument("out", type=Path)
    rec.add_argument("--python", default=sys.executable)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.what == "build":
        build(args.dir.resolve())
        return 0
    if args.what == "record":
        record(args.dir.resolve(), args.out, args.python)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
