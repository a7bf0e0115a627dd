"""The `subcache` finding's advice does what it says (issue 28, item 8).

Each case plants a damaged file in the autotune sub-cache of a real JAX cache (hand-made bytes:
the damage is the point), follows the printed advice to the letter (runs the prune command it
names, removes the files it says to remove) and scans again: the finding must be gone.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from cachedoctor.layout import AUTOTUNE_DIR
from tests.support.caches import SCRIPT, cli_env

CANONICAL = base64.urlsafe_b64encode(hashlib.sha256(b"fusion").digest()).rstrip(b"=").decode()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, env=cli_env(), timeout=120
    )


def subcache_findings(cache: Path) -> list[dict[str, object]]:
    proc = cli("scan", str(cache), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return [f for f in json.loads(proc.stdout)["findings"] if f["kind"] == "subcache"]


def follow(advice: str, cache: Path) -> None:
    """Do what the advice says: each `cachedoctor ...` command on this cache, each removal."""
    for command in re.findall(r"`(cachedoctor [^`]+)`", advice):
        words = shlex.split(command)[1:]
        if "--stale-after" in advice and "0 while no XLA runs" in advice:
            words += ["--stale-after", "0"]  # no XLA process writes this test's cache
        proc = cli(*words, str(cache))
        assert proc.returncode == 0, proc.stderr
    for names in re.findall(r"remove (.+?) yourself", advice):
        for name in names.split(", "):
            (cache / AUTOTUNE_DIR / name).unlink()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "mentions_prune"),
    [
        ("junk.textproto", False),  # not XLA's name: prune never removes it
        (f"{CANONICAL}.textproto", True),  # XLA's name, damaged content: prune clears it
        (f"tmp/tmp_per_fusion_cache_{CANONICAL}_123.textproto", True),  # a fresh in-flight write
    ],
)
def test_following_the_advice_clears_the_finding(
    seed_cache: Path, copy_of, name: str, mentions_prune: bool
) -> None:
    cache = copy_of(seed_cache)
    planted = cache / AUTOTUNE_DIR / name
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"\x00\xffnot a text proto {{{")
    (finding,) = subcache_findings(cache)
    advice = str(finding["advice"])
    assert ("cachedoctor prune" in advice) is mentions_prune, advice
    assert "they are" not in advice, advice  # one file: "it is"
    follow(advice, cache)
    assert subcache_findings(cache) == [], advice
    assert not planted.exists()
