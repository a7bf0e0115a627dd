"""`cachedoctor diff` on real caches written by real JAX (see conftest.make_cache)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.cache import listdir, reader
from cachedoctor.cache.jaxenv import installed_jax
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.check.runner import program_env, run_command
from cachedoctor.core.diff.compare import diff_entries, diff_module
from cachedoctor.core.diff.report import VerdictKind
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.errors import EntryNotFoundError
from cachedoctor.programs import program_path
from cachedoctor.storage.location import Location
from cachedoctor.xla import optionschema
from tests.support.caches import cli_env, make_cache, other_jax_python, raw_payload_layout
from tests.support.hookrun import compat_params, run_program
from tests.support.sessioncache import SharedBuilds

AUTOTUNE_FIELD = "executable_build_options.debug_options.xla_gpu_per_fusion_autotune_cache_dir"


def entries(cache: Path, module: str) -> list[EntryInfo]:
    out = []
    for item in listdir.list_cache(cache).entries:
        info = reader.decode_entry(cache / item.name, key=item.key)
        assert isinstance(info, EntryInfo)
        if info.module == module:
            out.append(info)
    return out


# The console script's behaviour (`python -m cachedoctor` drops main()'s exit code today).
_MAIN = "import sys; from cachedoctor.cli import main; sys.exit(main())"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _MAIN, "diff", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=False,
        timeout=120,
    )


@pytest.fixture(scope="module")
def moved(seed_cache: Path, shared_builds: SharedBuilds) -> Path:
    """seed_cache copied to a new path, where the plain program runs again, and at size 32."""

    def make(root: Path) -> None:
        shutil.copytree(seed_cache, root / "cache", symlinks=True)
        make_cache(root / "cache", [("plain", {}), ("plain", {"CACHEDOCTOR_PLAIN_SIZE": "32"})])

    root, _ = shared_builds("diff-moved", make, str(seed_cache))
    return root / "cache"


def _plain(cache: Path, *, size: int, written_under: Path) -> EntryInfo:
    found = [
        e
        for e in entries(cache, "jit_g")
        if e.hlo is not None
        and e.hlo.parameters[0].startswith(f"f32[{size}]")
        and (e.autotune_dir or "").startswith(str(written_under))
    ]
    if not found:
        pytest.skip(f"no jit_g entry of size {size} written under {written_under}")
    assert len(found) == 1
    return found[0]


# --- the Done-when list --------------------------------------------------------------------


@pytest.mark.slow
def test_two_seed_runs_are_the_same_executable_under_unstable_keys(seed_cache: Path) -> None:
    a, b, *_ = entries(seed_cache, "jit_f")
    report = diff_entries(a.path, b.path)
    assert report.verdict.kind is VerdictKind.SAME_EXECUTABLE
    assert report.verdict.line.startswith("same executable under different keys")
    assert "key instability" in report.verdict.line
    assert "custom_partitioning" in " ".join(report.verdict.because)
    assert report.executable.identical and report.hlo.same_canonical
    assert report.options.compile_options == ()
    assert not report.manifest.available  # the seed ran without the hook
    assert report.manifest.note.startswith("no manifest:")
    assert report.equivalent


@pytest.mark.slow
def test_relocated_cache_names_the_autotune_path_field(seed_cache: Path, moved: Path) -> None:
    if installed_jax().hashes_autotune_dir is False:
        pytest.skip("the installed jax does not hash the autotune path: no relocated entry")
    original = _plain(seed_cache, size=16, written_under=seed_cache)
    relocated = _plain(moved, size=16, written_under=moved)
    assert original.key != relocated.key
    report = diff_entries(original.path, relocated.path)
    v = report.verdict
    assert v.kind is VerdictKind.SAME_PROGRAM
    assert AUTOTUNE_FIELD in v.line and "cache relocated" in v.line
    assert str(seed_cache) in v.line and str(moved) in v.line
    (field,) = report.options.compile_options
    assert field.path == AUTOTUNE_FIELD and field.numbers == (3, 3, 310)
    assert report.hlo.same_canonical and report.hlo.removed == ()
    changed = {s.name for s in report.executable.sections if not s.same}
    assert changed == {"compile options", "HLO module config"}


@pytest.mark.slow
def test_two_input_shapes_are_different_programs(moved: Path) -> None:
    small = _plain(moved, size=16, written_under=moved)
    large = _plain(moved, size=32, written_under=moved)
    report = diff_entries(small.path, large.path, context=0)
    v = report.verdict
    assert v.kind is VerdictKind.DIFFERENT_PROGRAM
    assert "parameter shapes differ" in v.line and "f32[16]" in v.line and "f32[32]" in v.line
    assert not v.equivalent
    assert any(line.startswith("+") and "f32[32]" in line for line in report.hlo.canonical_diff)
    assert not any(line.startswith(" ") for line in report.hlo.canonical_diff[3:])  # context 0
    assert all(r.a != r.b for r in report.hlo.removed)
    header = {d.path: (d.a, d.b) for d in report.options.ifrt_header}
    assert header.get("output_specs[0].shape.dims") == ("[16]", "[32]")


@pytest.fixture(scope="module")
def other_jax(shared_builds: SharedBuilds) -> Path:
    """The plain program written by a second, older JAX (tests/support/otherjax.py)."""
    python = other_jax_python()

    def make(root: Path) -> None:
        make_cache(root / "cache", [("plain", {})], python=python)

    root, _ = shared_builds("diff-other-jax", make, python)
    return root / "cache"


@pytest.mark.slow
def test_two_jax_versions_of_one_program(seed_cache: Path, other_jax: Path) -> None:
    (old,) = entries(other_jax, "jit_g")
    new = _plain(seed_cache, size=16, written_under=seed_cache)
    old_layout, new_layout = raw_payload_layout(Path(old.path)), raw_payload_layout(Path(new.path))
    # crossver pairs jax 0.8.3 (no header) with a JAX that writes the pjrt_ifrt header
    assert old_layout == "pjrt" and new_layout.startswith("ifrt-v"), (old_layout, new_layout)
    report = diff_entries(old.path, new.path)
    v = report.verdict
    assert v.kind is VerdictKind.DIFFERENT_JAX, v.line
    assert f"payload format {old_layout} (A) vs {new_layout} (B)" in v.line
    assert not v.equivalent
    assert report.options.names_from  # every option path below is named where known
    assert all(d.named for d in report.options.compile_options[:20])


@pytest.mark.slow
def test_entry_against_itself_is_identical(seed_cache: Path) -> None:
    (g,) = entries(seed_cache, "jit_g")[:1]
    report = diff_entries(g.path, g.path)
    assert report.verdict.kind is VerdictKind.IDENTICAL
    assert report.verdict.line == "identical: A and B are the same file"
    assert report.equivalent and report.executable.identical


@pytest.mark.slow
def test_same_key_in_two_directories_is_identical(seed_cache: Path, moved: Path) -> None:
    (g,) = entries(seed_cache, "jit_g")[:1]
    report = diff_entries(g.path, moved / Path(g.path).name)
    assert report.verdict.kind is VerdictKind.IDENTICAL
    assert "same key" in report.verdict.line


@pytest.mark.slow
def test_module_mode_compares_each_entry_with_the_latest(seed_cache: Path) -> None:
    report = diff_module(Location.parse(seed_cache), "jit_f")
    keys = [e.key for e in entries(seed_cache, "jit_f")]
    assert report.latest in keys and len(report.reports) == len(keys) - 1
    assert all(r.b.key == report.latest for r in report.reports)
    assert all(r.verdict.kind is VerdictKind.SAME_EXECUTABLE for r in report.reports)
    with pytest.raises(EntryNotFoundError, match="jit_f"):
        diff_module(Location.parse(seed_cache), "no_such_module")


# --- the command line ----------------------------------------------------------------------


@pytest.mark.slow
def test_cli_exit_codes_and_verdict_first(seed_cache: Path, moved: Path) -> None:
    a, b, *_ = entries(seed_cache, "jit_f")
    same = cli("--dir", str(seed_cache), a.key, b.key[:20])
    assert same.returncode == 0, same.stderr
    assert same.stdout.startswith("verdict: same executable under different keys")
    assert "no manifest: the pre-compilation module is not recorded" in same.stdout  # no hook ran
    small = _plain(moved, size=16, written_under=moved)
    large = _plain(moved, size=32, written_under=moved)
    differ = cli(small.path, large.path, "--hlo-context", "1")
    assert differ.returncode == 1, differ.stderr
    assert differ.stdout.startswith("verdict: different programs: parameter shapes differ")
    for section in ("key components", "compile options", "HLO", "executable bytes"):
        assert f"\n{section}\n" in differ.stdout


@pytest.mark.slow
def test_cli_json_parses_back(seed_cache: Path, moved: Path) -> None:
    small = _plain(moved, size=16, written_under=moved)
    large = _plain(moved, size=32, written_under=moved)
    out = cli(small.path, large.path, "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema_version"] >= 1 and doc["document"] == "diff"
    keys = list(doc)
    assert keys.index("verdict") < keys.index("a") < keys.index("hlo")
    assert doc["verdict"]["kind"] == "different-program" and doc["equivalent"] is False
    assert doc["a"]["key"] == small.key and doc["b"]["key"] == large.key
    assert doc["hlo"]["canonical_diff"] and isinstance(doc["options"]["compile_options"], list)
    module = cli("--dir", str(seed_cache), "--module", "jit_f", "--json")
    assert module.returncode == 0, module.stderr
    mdoc = json.loads(module.stdout)
    assert mdoc["document"] == "diff-module" and mdoc["equivalent"] is True
    assert {d["verdict"]["kind"] for d in mdoc["diffs"]} == {"same-executable"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "slug"),
    [
        (["--dir", "{cache}", "jit_nothing", "jit_g"], "entry-not-found"),
        (["--dir", "{cache}", "jit_f", "jit_g"], "ambiguous-entry"),  # ambiguous prefix
        (["{cache}/no-such-file-cache", "{cache}/x"], "entry-not-found"),
        (["jit_f", "jit_g"], "entry-not-found"),  # no --dir, no JAX_COMPILATION_CACHE_DIR
        (["{corrupt}", "{corrupt}"], "corrupt"),
    ],
)
def test_cli_bad_refs_are_one_line_errors(
    seed_cache: Path, tmp_path: Path, args: list[str], slug: str
) -> None:
    corrupt = tmp_path / ("jit_bad-" + "0" * 64 + "-cache")
    corrupt.write_bytes(b"\x28\xb5\x2f\xfd" + b"not a zstd frame at all")  # adversarial bytes
    out = cli(*[a.format(cache=seed_cache, corrupt=corrupt) for a in args])
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cachedoctor: {slug}:"), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


@pytest.mark.slow
def test_cli_usage_errors(seed_cache: Path) -> None:
    only_one = cli("--dir", str(seed_cache), "jit_g")
    assert only_one.returncode == 2 and "give two entries" in only_one.stderr
    both = cli("--dir", str(seed_cache), "--module", "jit_f", "jit_g")
    assert both.returncode == 2 and "not both" in both.stderr


@pytest.mark.slow
def test_raw_hlo_diff_uses_jaxlib_text(moved: Path) -> None:
    small = _plain(moved, size=16, written_under=moved)
    large = _plain(moved, size=32, written_under=moved)
    report = diff_entries(small.path, large.path, raw_hlo=True)
    assert report.hlo.raw_diff is not None
    assert any(line.startswith("+") and "f32[32]" in line for line in report.hlo.raw_diff)


# --- option names ----------------------------------------------------------------------------


def test_static_table_names_the_documented_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/format.md fields are named even without a jaxlib to read names from."""
    monkeypatch.setenv("CACHEDOCTOR_NO_JAXLIB_SCHEMA", "1")
    optionschema._installed_schema_cached.cache_clear()
    optionschema.schema.cache_clear()
    try:
        sch = optionschema.schema()
        assert sch.source == "static table"
        debug = {
            61: "xla_gpu_cuda_data_dir",
            102: "xla_force_host_platform_device_count",
            109: "xla_dump_to",
            268: "xla_gpu_enable_llvm_module_compilation_parallelism",
            306: "xla_gpu_kernel_cache_file",
            310: "xla_gpu_per_fusion_autotune_cache_dir",
            324: "xla_gpu_experimental_autotune_cache_mode",
            407: "xla_gpu_experimental_autotuner_cache_dir",
        }
        for number, name in debug.items():
            assert sch.field(optionschema.DEBUG_OPTIONS, number).name == name  # type: ignore[union-attr]
        build = {3: "debug_options", 4: "num_replicas", 5: "num_partitions", 19: None}
        for number, expected in build.items():
            f = sch.field(optionschema.BUILD_OPTIONS, number)
            assert f is not None and (expected is None or f.name == expected)
        assert sch.field(optionschema.COMPILE_OPTIONS, 3).name == "executable_build_options"  # type: ignore[union-attr]
        assert sch.enum_name("xla.DebugOptions.AutotuneCacheMode", 1) is not None
    finally:
        optionschema._installed_schema_cached.cache_clear()
        optionschema.schema.cache_clear()


def test_installed_jaxlib_descriptors_agree_with_the_static_table() -> None:
    installed = optionschema.installed_schema()
    if installed is None:
        pytest.skip("the installed jaxlib embeds no readable XLA descriptors")
    static = optionschema._static_schema()
    for message in (optionschema.COMPILE_OPTIONS, optionschema.BUILD_OPTIONS):
        assert set(installed.messages[message].fields) <= set(static.messages[message].fields)
    for number in (102, 109, 306, 310, 324):
        got = installed.field(optionschema.DEBUG_OPTIONS, number)
        assert got is not None
        assert got.name == static.field(optionschema.DEBUG_OPTIONS, number).name  # type: ignore[union-attr]


# --- manifests (the stable-key hook's layer) ----------------------------------------------------

_HOOK_RUNNER = """
import runpy, sys
from cachedoctor.stablekeys import hook
assert hook.install("observe", record_ir=True), "hook not installed"
prog = sys.argv[1]
sys.argv = [prog]
runpy.run_path(prog, run_name="__main__")
"""


@pytest.mark.slow
def test_manifests_name_the_backend_config_of_both_runs(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    env = program_env(str(cache))
    for _ in range(2):
        run = run_command([sys.executable, "-c", _HOOK_RUNNER, str(program_path("seed"))], env)
        assert run.returncode == 0, run.stderr[-2000:]
    a, b = entries(cache, "jit_f")
    report = diff_entries(a.path, b.path)
    m = report.manifest
    assert m.available and m.stable_keys[0] == m.stable_keys[1]
    (pointer,) = [v for v in m.volatile if v.a_raw != v.b_raw]
    assert pointer.field.endswith("backend_config") and pointer.a_raw and pointer.b_raw
    assert pointer.a_raw.isdigit() and pointer.b_raw.isdigit()
    assert report.verdict.kind is VerdictKind.SAME_EXECUTABLE
    assert pointer.a_raw in report.verdict.line and pointer.b_raw in report.verdict.line
    assert all(c.same for c in m.components)
    assert m.backend_configs and all(t == "CustomSPMDPartitioning" for t, _, _ in m.backend_configs)


@pytest.mark.slow
def test_manifest_components_that_differ_are_named(
    seed_cache: Path, copy_of: Callable[[Path], Path]
) -> None:
    """Manifest files in the documented format, for two real entries; one input changed."""
    from cachedoctor.stablekeys import manifest as mf

    cache = copy_of(seed_cache)
    a, b, *_ = entries(cache, "jit_f")

    def write(key: str, flags: list[str], raw: str) -> None:
        flags_b64 = __import__("base64").b64encode(" ".join(flags).encode()).decode()
        digest = __import__("hashlib").sha256(" ".join(flags).encode()).hexdigest()
        m = mf.Manifest(
            key=key,
            stable_key=key,
            jax_key=key,
            mode="observe",
            module_name="jit_f",
            hasher_version=1,
            components=[
                {"name": "computation", "digest": "00" * 32, "data": None},
                {"name": "XLA flags", "digest": digest, "data": flags_b64},
            ],
            volatile=[{"field": "custom_call[0].backend_config", "raw": raw, "canonical": "c"}],
            sound=True,
            xla_flags=flags,
            cache_dir=str(cache),
            versions={"jax": "0.10.2"},
            platform={"platform": "cpu"},
            created=0.0,
            host="h",
            pid=1,
        )
        mf.write_manifest(
            Location.parse(cache), m, ir_text='"stablehlo.custom_call"() {backend_config = "c"}'
        )

    write(a.key, ["--xla_a=1"], "111")
    write(b.key, ["--xla_a=2"], "222")
    assert gzip.decompress((mf.manifest_dir(cache) / f"{a.key}.mlir.gz").read_bytes())
    report = diff_entries(a.path, b.path)
    changed = [c for c in report.manifest.components if not c.same]
    assert [c.name for c in changed] == ["XLA flags"]
    assert (changed[0].a, changed[0].b) == ("--xla_a=1", "--xla_a=2")
    assert "111 vs 222" in report.verdict.line
    os.unlink(mf.manifest_path(cache, b.key))
    assert diff_entries(a.path, b.path).manifest.note.endswith("(no manifest for B)")


WRITTEN_RE = re.compile(r"Writing (\S+) to persistent compilation cache with key '([^']+)'")


@pytest.mark.slow
@pytest.mark.parametrize("python", [pytest.param(sys.executable, id="this-jax"), *compat_params()])
def test_a_stable_key_and_plain_jaxs_key_are_one_program_not_instability(
    tmp_path: Path, python: str
) -> None:
    """One program run under `cachedoctor enable`'s stable keys, then without the hook: two
    keys JAX logs writing, one program. diff agrees with scan's same-program: no instability,
    and no advice to enable what made the pair."""
    cache = tmp_path / "cache"
    cache.mkdir()
    module = "jit_g"
    written = {}
    for mode in ("stable", "none"):  # the other order hits: the hook also looks up JAX's key
        log = run_program("plain", cache, mode=mode, python=python).stderr
        written[mode] = dict(WRITTEN_RE.findall(log))[module]  # JAX's own log of its write
    stable, plain = written["stable"], written["none"]
    assert plain != stable, written

    report = diff_entries(cache / f"{plain}-cache", cache / f"{stable}-cache")
    v = report.verdict
    assert report.equivalent and "instability" not in v.line.replace("not key instability", "")
    assert "cachedoctor enable" not in (v.advice or ""), v.advice
    assert report.manifest.hooked == (False, True)
    if v.kind is VerdictKind.SAME_EXECUTABLE:
        assert "not key instability" in v.line, v.line
        # the hook computed JAX's own key of its compile: the key plain JAX logged writing
        assert f"JAX's own key of B's compile: {plain}" in " ".join(v.because), v.because
    else:  # jax 0.8.3 compiles the pair to different bytes: still one program
        assert v.kind is VerdictKind.SAME_PROGRAM, v

    scan = scan_directory(Location.parse(cache))
    kinds = {f.kind for f in scan.findings if f.module == module}
    assert FindingKind.SAME_PROGRAM in kinds and FindingKind.UNSTABLE_KEY not in kinds, kinds
    module_report = diff_module(Location.parse(cache), module)
    assert [r.verdict.line for r in module_report.reports] == [v.line]
