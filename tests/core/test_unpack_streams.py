"""`unpack` holds a megabyte of a member at a time, staging and writing alike (the kernel's
peak resident size of a fresh process is the oracle), and two unpacks into one target leave a
cache that scan finds whole: no manifest without its entry, and a second unpack that says it
wrote nothing when it wrote nothing (JAX's own programs write the caches)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.hookrun import base_env
from tests.support.keylog import run_logged

pytestmark = pytest.mark.slow

MEMBER_MIB = 192

# One unpack --apply of a bundle whose one member is MEMBER_MIB of random bytes, in a fresh
# process; prints how far its peak resident size rose. What is measured is the bundle's copy
# (staging, then the write into the target): the reader's verdict and the preflight, which read
# an entry as the reader does and are not under test here, are stood in for.
_UNPACK = r"""
import hashlib, io, json, os, resource, sys, tarfile
from pathlib import Path
from cachedoctor.core import bundle, preflight
from cachedoctor.storage.location import Location

root, mib = Path(sys.argv[1]), int(sys.argv[2])
key = "jit_big-" + "b" * 64
member, digest = root / "member", hashlib.sha256()
with open(member, "wb") as f:
    for _ in range(mib):
        chunk = os.urandom(1 << 20)
        digest.update(chunk)
        f.write(chunk)
entry = {"key": key, "module": "jit_big", "size": mib << 20, "sha256": digest.hexdigest()}
header = json.dumps({"format": "cachedoctor-bundle/1", "entries": [entry], "files": []}).encode()
with tarfile.open(root / "b.tar", "w") as tar:
    info = tarfile.TarInfo("cachedoctor-bundle.json")
    info.size = len(header)
    tar.addfile(info, io.BytesIO(header))
    info = tarfile.TarInfo(f"entries/{key}-cache")
    info.size = mib << 20
    with open(member, "rb") as f:
        tar.addfile(info, f)
member.unlink()

def unjudged(where, *, cache_dir=None, **_):
    return preflight.PreflightReport(where.spelling, cache_dir, None, "off", problem="stood in")

bundle.preflight.predict = unjudged
if hasattr(bundle, "_undecodable"):
    bundle._undecodable = lambda *args: {}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = bundle.unpack(root / "b.tar", Location.local(root / "target"), apply=True, relocate=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
written = hashlib.sha256()
with open(root / "target" / f"{key}-cache", "rb") as f:
    while chunk := f.read(1 << 20):
        written.update(chunk)
print(json.dumps({
    "rise_mib": (after - before) / 1024,
    "actions": [e.action for e in report.entries],
    "same": written.hexdigest() == digest.hexdigest(),
}))
"""


def test_unpack_never_holds_a_member_whole(tmp_path: Path) -> None:
    """Trust V: unpack staged each member a megabyte at a time but then read it whole to write
    it into the target (a 20 GB entry, 20 GB of memory). Now the write streams too: a member
    of 192 MiB raises the peak by a few megabytes, not by the member."""
    done = subprocess.run(
        [sys.executable, "-c", _UNPACK, str(tmp_path), str(MEMBER_MIB)],
        capture_output=True,
        text=True,
        env=base_env(None),
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["actions"] == ["written"] and result["same"], result
    assert result["rise_mib"] < MEMBER_MIB / 4, result


def _seed() -> Path:
    from cachedoctor.programs import program_path

    return Path(program_path("seed"))


def _unpack(bundle: Path, target: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """``unpack --apply --json ARGS``: its exit status, document and stderr."""
    env = base_env(None, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    done = run_cli("unpack", str(bundle), str(target), "--apply", "--json", *args, env=env)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def _orphan_manifests(target: Path) -> list[dict[str, Any]]:
    env = base_env(None)
    done = run_cli("scan", "--json", str(target), env=env)
    assert done.returncode in (0, 1), done.stderr
    findings = json.loads(done.stdout)["findings"]
    return [f for f in findings if f["kind"] == "not-stored"]


@pytest.mark.parametrize(
    "runs",
    [("relocate", "relocate"), ("keep", "relocate"), ("relocate", "keep"), ("overlap", "relocate")],
)
def test_two_unpacks_into_one_target_leave_no_orphan_manifest(
    tmp_path: Path, runs: tuple[str, str]
) -> None:
    """A cache written by the seed program under the observe hook, packed, unpacked twice at
    another path (relocated entries move to their stable keys, or stay with --no-relocate), or
    a second, overlapping bundle packed after one more program ran. Each time scan finds no
    key manifest without its entry, and a second unpack that found every entry there (under
    its key or its stable key) says it wrote none: before, it wrote them again, then dropped
    them as duplicates of their stable keys, and said it wrote and moved them."""
    source = tmp_path / "a" / "cache"
    for _ in range(2):
        run_logged(source, "observe", program=_seed())
    bundles = [tmp_path / "first.tar", tmp_path / "second.tar"]
    env = base_env(None)
    assert run_cli("pack", str(source), "-o", str(bundles[0]), env=env).returncode == 0
    if runs[0] == "overlap":
        from cachedoctor.programs import program_path

        run_logged(source, "observe", program=Path(program_path("plain")))
    assert run_cli("pack", str(source), "-o", str(bundles[1]), env=env).returncode == 0
    target = tmp_path / "b" / "cache"
    docs = []
    for bundle, how in zip(bundles, runs, strict=True):
        args = ("--no-relocate",) if how == "keep" else ()
        docs.append(_unpack(bundle, target, *args)[1])
        assert _orphan_manifests(target) == [], (how, docs[-1])
    first, second = docs
    if runs == ("relocate", "relocate") or runs[0] == "overlap":
        again = {e["key"] for e in first["entries"]}
        for e in second["entries"]:
            if e["key"] in again:  # every entry the first wrote is there, under its stable key
                assert e["action"] == "present" and "there already" in e["words"], e
        assert second["companions"] == second["actions"].get("written", 0)  # one each, no more
        assert {old for old, _ in second["moved"]} <= {
            e["key"] for e in second["entries"] if e["action"] == "written"
        }
    written = sum(1 for e in second["entries"] if e["action"] == "written")
    assert second["actions"].get("written", 0) == written
