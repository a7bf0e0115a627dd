"""The ``relocated`` rule's judgement on stored paths, without JAX runs (those are in
tests/e2e/test_relocated_spelling.py): JAX's own ``Path`` is the oracle for the string it hashes.
"""

from __future__ import annotations

import pytest

from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.scan.rules.keys import relocated_findings
from cachedoctor.storage.urls import jax_spelling, jax_subpath, subcache_dir_for

AUTOTUNE = "xla_gpu_per_fusion_autotune_cache_dir"
KERNEL = "xla_gpu_kernel_cache_file"
HASHES = JaxInfo("0.10.2", "0.10.2", True, True, None)

SPELLINGS = [
    "caches/sp",
    "caches/sp/",
    "./caches//sp",
    "caches/../caches/sp",
    "/abs/caches/sp",
    "/abs//caches/./sp/",
    "//net/caches",
    ".",
    "",
    "~/caches",
    "gs://bucket/caches/sp",
    "gs://bucket//caches/./sp/",
    "s3://bucket",
    "s3://bucket/a/../b",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_jax_subpath_is_what_jax_builds(spelling: str) -> None:
    """``jax._src.compiler.get_compile_options``: ``str(Path(cache_dir) / name)``."""
    from jax._src import path as jax_path

    if "://" in spelling and not jax_path.epath_installed:
        pytest.skip("JAX without etils.epath cannot use a bucket cache dir")
    assert jax_subpath(spelling, AUTOTUNE) == str(jax_path.Path(spelling) / AUTOTUNE)
    if spelling:
        assert jax_spelling(spelling) == str(jax_path.Path(spelling))


def entry(key: str, autotune: str | None = None, kernel: str | None = None) -> EntryInfo:
    return EntryInfo(
        key=key,
        module=key.split("-")[0],
        path=f"/x/{key}-cache",
        size=10,
        mtime_ns=0,
        autotune_dir=autotune,
        kernel_cache_file=kernel,
    )


def flagged(root: str, entries: list[EntryInfo], info: JaxInfo = HASHES) -> set[str]:
    return {k for f in relocated_findings(root, entries, info, frozenset()) for k in f.entries}


def test_judged_by_the_string_as_spelled() -> None:
    entries = [
        entry("jit_a-1", f"/abs/caches/sp/{AUTOTUNE}"),
        entry("jit_b-2", f"caches/sp/{AUTOTUNE}"),
        entry("jit_c-3", f"caches/../caches/sp/{AUTOTUNE}"),
        entry("jit_d-4", AUTOTUNE),  # JAX_COMPILATION_CACHE_DIR=.
    ]
    assert flagged("/abs/caches/sp/", entries) == {"jit_b-2", "jit_c-3", "jit_d-4"}
    assert flagged("./caches//sp", entries) == {"jit_a-1", "jit_c-3", "jit_d-4"}
    assert flagged("caches/../caches/sp", entries) == {"jit_a-1", "jit_b-2", "jit_d-4"}
    assert flagged(".", entries) == {"jit_a-1", "jit_b-2", "jit_c-3"}


def test_a_path_jax_did_not_build_is_no_evidence() -> None:
    """XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=/elsewhere with JAX's sub-caches off:
    every run hashes that value whatever the cache dir's spelling."""
    entries = [entry("jit_a-1", "/elsewhere/tuning"), entry("jit_b-2", kernel="/k/kernels.bin")]
    assert flagged("caches/sp", entries) == set()


def test_kernel_cache_file_and_what_this_jax_hashes() -> None:
    entries = [entry("jit_a-1", f"/old/{AUTOTUNE}", f"/old/{KERNEL}")]
    findings = relocated_findings("/new", entries, HASHES, frozenset())
    assert sorted(AUTOTUNE in f.message or KERNEL in f.message for f in findings) == [True, True]
    jax012 = JaxInfo("0.12.0", "0.12.0", False, True, None)
    (only,) = relocated_findings("/new", entries, jax012, frozenset())
    assert KERNEL in only.message and "will never" in only.message
    unknown = JaxInfo(None, None, None, None, None)
    assert all(
        "may never" in f.message for f in relocated_findings("/new", entries, unknown, frozenset())
    )
    assert flagged("/new", entries, JaxInfo("x", "x", False, False, None)) == set()
    assert relocated_findings("/new", entries, HASHES, frozenset({"jit_a-1"})) == []


def test_a_bucket_and_its_local_subcaches() -> None:
    url = "gs://bucket/caches"
    local = subcache_dir_for(url)
    assert local is not None
    entries = [
        entry("jit_a-1", f"gs://bucket/caches/{AUTOTUNE}"),  # JAX's own spelling
        entry("jit_b-2", f"{local}/{AUTOTUNE}"),  # `enable`'s local folder
        entry("jit_c-3", f"gs://bucket/other/{AUTOTUNE}"),
    ]
    assert flagged(url + "/", entries) == {"jit_c-3"}


def test_the_finding_names_its_evidence() -> None:
    (f,) = relocated_findings(
        "./caches//sp", [entry("jit_a-1", f"/abs/sp/{AUTOTUNE}")], HASHES, frozenset()
    )
    assert "written for a cache spelled /abs/sp;" in f.message
    assert "with the cache dir spelled caches/sp" in f.message
    assert "judged for the cache dir spelled caches/sp (as cachedoctor was given it)" in f.evidence
    assert f"JAX builds caches/sp/{AUTOTUNE}" in f.evidence
    assert "`cachedoctor scan /abs/sp`" in f.advice
