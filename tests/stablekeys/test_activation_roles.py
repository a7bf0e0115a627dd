"""``status``'s multi-host roles, from what the fresh interpreter's JAX answered as process 0
and as process 1 (the probe; a whole job on a bucket: test_hook_distributed.py)."""

from __future__ import annotations

from cachedoctor.stablekeys.activation import ROLES, observed_roles


def _probe(dir0: str | None, mode1: str, kernel: str | None = None) -> dict[str, object]:
    def one(mode: str) -> dict[str, str | None]:
        return {"autotune_dir": dir0, "autotune_mode": mode, "kernel_cache_file": kernel}

    return {"roles": {"0": one("UPDATE"), "1": one(mode1)}}


def test_jax_s_roles_are_reported_as_found() -> None:
    lines, warnings = observed_roles(_probe("/local/autotune", "READ"))
    assert (
        "autotune sub-cache /local/autotune: process 0 UPDATE, processes 1..N-1 READ" in (lines[1])
    )
    assert lines[2] == "kernel cache file: off" and warnings == []


def test_lost_roles_and_urls_are_warned_about() -> None:
    _, warnings = observed_roles(_probe("/local/autotune", "UPDATE"))
    assert [w.code for w in warnings] == ["autotune-roles"]
    assert "every process of a job writes /local/autotune" in warnings[0].message
    url = "s3://b/c/xla_gpu_per_fusion_autotune_cache_dir"
    _, warnings = observed_roles(_probe(url, "READ", kernel="s3://b/c/xla_gpu_kernel_cache_file"))
    assert [w.code for w in warnings] == ["subcache-url", "subcache-url"]


def test_without_an_answer_the_roles_are_described_and_why() -> None:
    lines, warnings = observed_roles({"roles_error": "ImportError: no jax"})
    assert lines[: len(ROLES)] == ROLES and "ImportError: no jax" in lines[-1]
    assert warnings == []
