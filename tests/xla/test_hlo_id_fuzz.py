"""Fuzz class: flipped ids and counts inside a module that still parses (issue 54).

One flipped bit in a stored HLO instruction's id, in a real 2.4 KB entry, made ``show --hlo``
allocate about 8 GB inside jaxlib: XLA sizes its tables by the largest id and count a module
holds. Here a real entry JAX wrote (the seed program's ``jit_f``) is taken apart, its
``HloModuleProto`` (and the config beside it) changed with protobuf, using the schemas the
installed jaxlib embeds (``tests/support/jaxlib_schema.py``), so that the module still parses,
and the entry put back together as JAX writes it (``zstd`` over the compile time, the
``pjrt_ifrt`` header and the ``ExecutableAndOptionsProto``). The changes: an instruction id (its
own or an operand's), a computation id (its own, its root's, the entry's or a called one's), a
replica or partition count, an instruction's operand count; each a flipped bit (or a repeat
count) drawn from a fixed seed, plus the bit of the report.

``show --hlo``, ``diff`` and ``scan`` then run on every variant in one child process whose
address space is capped (``RLIMIT_AS``, inherited by the renderer it starts): each finishes,
prints no traceback, and where jaxlib cannot render a module says so in words: ``(refused: …)``
or ``(jaxlib could not render this module: <why>)``. A handful of variants, one process: each
render starts jaxlib (about 1.5 s).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

import cachedoctor
from cachedoctor.cache.model import EntryDetail
from cachedoctor.cache.reader import decode_entry
from cachedoctor.formats import wire
from tests.support.caches import REPO
from tests.support.jaxlib_schema import message_class

pytestmark = pytest.mark.slow  # a JAX-built cache, jaxlib's renderer in child processes

ADDRESS_SPACE_CAP = 4 << 30  # "a few GB": the whole run, the renderer it starts included
CPU_EXECUTABLE = ("xla/service/cpu/executable.proto", "xla.cpu.CompilationResultProto")
REPORTED = "instruction-id-bit30"  # the report's case: jaxlib asked for about 8 GB
# the bits flipped in an id: its low word, which XLA sizes its tables by (the high word of an
# instruction's id is its computation's)
ID_BITS = (16, 32)


def _outer_class() -> type[Message]:
    """``ExecutableAndOptionsProto`` as far as this test needs it: field 1, the serialized
    executable (jaxlib embeds no descriptor of it; its other fields stay as unknown fields,
    which protobuf writes back as they were)."""
    file = descriptor_pb2.FileDescriptorProto(name="issue54_fuzz.proto", package="issue54")
    message = file.message_type.add(name="ExecutableAndOptions")
    message.field.add(
        name="serialized_executable",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    found: type[Any] = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("issue54.ExecutableAndOptions")
    )
    return found


class TakenApart:
    """A real CPU entry: what precedes the executable (compile time, header), the outer
    message, and the executable (``xla.cpu.CompilationResultProto``) as protobuf messages."""

    def __init__(self, path: Path) -> None:
        detail = decode_entry(path, detail=True)
        assert isinstance(detail, EntryDetail) and detail.ifrt_header is not None
        plain = zstandard.ZstdDecompressor().decompress(path.read_bytes(), max_output_size=1 << 30)
        header = wire.encode_varint(len(detail.ifrt_header)) + detail.ifrt_header
        self.prefix, body = plain[: 4 + len(header)], plain[4 + len(header) :]
        assert plain[4 : 4 + len(header)] == header
        self.outer = _outer_class().FromString(body)
        self.executable = message_class(*CPU_EXECUTABLE).FromString(
            self.outer.serialized_executable
        )
        # the premise: protobuf reads the module the reader found, byte for byte
        assert self.executable.hlo_module.hlo_module.SerializeToString() == detail.hlo_module

    def variant(self, change: Callable[[Any, random.Random], str], seed: str) -> tuple[bytes, str]:
        """The entry with ``change`` made to a copy of its executable: bytes, and what changed."""
        executable = type(self.executable)()
        executable.CopyFrom(self.executable)
        said = change(executable, random.Random(seed))
        module = executable.hlo_module.hlo_module
        type(module).FromString(module.SerializeToString())  # it still parses
        outer = type(self.outer)()
        outer.CopyFrom(self.outer)
        outer.serialized_executable = executable.SerializeToString()
        return zstandard.ZstdCompressor().compress(self.prefix + outer.SerializeToString()), said


def _flip(value: int, bit: int) -> int:
    return value ^ (1 << bit)


def _instructions(executable: Any) -> list[Any]:
    return [i for c in executable.hlo_module.hlo_module.computations for i in c.instructions]


def _reported(executable: Any, rng: random.Random) -> str:
    instruction = executable.hlo_module.hlo_module.computations[-1].instructions[0]
    instruction.id = _flip(instruction.id, 30)
    return f"instruction {instruction.name}: id bit 30 flipped"


def _instruction_id(executable: Any, rng: random.Random) -> str:
    """An instruction's own id, or the id by which it names an operand."""
    instruction, bit = rng.choice(_instructions(executable)), rng.randrange(*ID_BITS)
    if instruction.operand_ids and rng.random() < 0.5:
        at = rng.randrange(len(instruction.operand_ids))
        instruction.operand_ids[at] = _flip(instruction.operand_ids[at], bit)
        return f"instruction {instruction.name}: operand {at}'s id bit {bit} flipped"
    instruction.id = _flip(instruction.id, bit)
    return f"instruction {instruction.name}: id bit {bit} flipped"


def _computation_id(executable: Any, rng: random.Random) -> str:
    """A computation's id or root id, the module's entry computation id, or a called one."""
    module, bit = executable.hlo_module.hlo_module, rng.randrange(*ID_BITS)
    callers = [i for i in _instructions(executable) if i.called_computation_ids]
    where = rng.choice(["id", "root_id", "entry"] + (["called"] if callers else []))
    if where == "entry":
        module.entry_computation_id = _flip(module.entry_computation_id, bit)
        return f"the module's entry_computation_id bit {bit} flipped"
    if where == "called":
        caller = rng.choice(callers)
        caller.called_computation_ids[0] = _flip(caller.called_computation_ids[0], bit)
        return f"instruction {caller.name}: called computation id bit {bit} flipped"
    computation = rng.choice(list(module.computations))
    setattr(computation, where, _flip(getattr(computation, where), bit))
    return f"computation {computation.name}: {where} bit {bit} flipped"


def _replica_or_partition_count(executable: Any, rng: random.Random) -> str:
    config = executable.hlo_module.config
    assignment = executable.hlo_module.hlo_module.device_assignment
    owner, name = rng.choice(
        [
            (config, "replica_count"),
            (config, "num_partitions"),
            (assignment, "replica_count"),
            (assignment, "computation_count"),
        ]
    )
    bit = rng.randrange(16, 31)  # the device assignment's counts are int32
    setattr(owner, name, _flip(getattr(owner, name), bit))
    return f"{type(owner).__name__}.{name} bit {bit} flipped"


def _operand_count(executable: Any, rng: random.Random) -> str:
    instruction = rng.choice([i for i in _instructions(executable) if i.operand_ids])
    extra = 1 << rng.randrange(10, 17)
    instruction.operand_ids.extend([instruction.operand_ids[0]] * extra)
    return f"instruction {instruction.name}: {extra} more operands"


CHANGES: dict[str, Callable[[Any, random.Random], str]] = {
    "unchanged": lambda executable, rng: "nothing (re-encoded)",
    REPORTED: _reported,
    "instruction-id": _instruction_id,
    "computation-id": _computation_id,
    "replica-or-partition-count": _replica_or_partition_count,
    "operand-count": _operand_count,
}

# Runs each command (a JSON list of arguments a line on stdin) in this process, as the console
# script does, under the address-space cap; one JSON line of its outcome each.
_DRIVER = r"""
import json, resource, sys
cap = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from tests.support.cli import invoke
for line in sys.stdin:
    args = json.loads(line)
    code, out, err = invoke(*args)
    print(json.dumps({"args": args, "code": code, "out": out, "err": err}), flush=True)
"""


def run_capped(commands: list[list[str]], env: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(ADDRESS_SPACE_CAP)],
        input="".join(json.dumps(c) + "\n" for c in commands),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
        check=False,
    )
    done = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(done) == len(commands), (
        f"the capped run stopped (exit {proc.returncode}) after {len(done)} of {len(commands)}"
        f" commands, in `{' '.join(commands[len(done)]) if len(done) < len(commands) else ''}`:"
        f" {proc.stderr[-2000:]}"
    )
    return done, proc.stderr


RENDERED = "ENTRY "  # jaxlib's HLO text names its entry computation so
SAID_WHY = re.compile(r"\((refused: .+?|jaxlib could not render this module: \S.+?)\)")


@pytest.fixture(scope="module")
def variants(seed_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every change made to one real ``jit_f`` entry, each under a key of its own."""
    source = sorted(seed_cache.glob("jit_f-*-cache"))[0]
    apart = TakenApart(source)
    folder = tmp_path_factory.mktemp("fuzz") / "cache"
    folder.mkdir()
    out: dict[str, Any] = {"folder": folder, "keys": {}, "said": {}}
    for n, (name, change) in enumerate(CHANGES.items()):
        data, said = apart.variant(change, f"issue-54-{name}")
        key = f"jit_f-{n:064x}"
        (folder / f"{key}-cache").write_bytes(data)
        out["keys"][name], out["said"][name] = key, said
    return out


def test_flipped_ids_and_counts_stay_bounded_and_say_why(variants: dict[str, Any]) -> None:
    folder, keys, said = variants["folder"], variants["keys"], variants["said"]
    control = keys["unchanged"]
    commands = [["scan", str(folder), "--json"]]
    for name, key in keys.items():
        commands.append(["show", key, "--dir", str(folder), "--hlo"])
        if name != "unchanged":
            commands.append(["diff", control, key, "--dir", str(folder)])
    commands.append(["diff", control, keys[REPORTED], "--dir", str(folder), "--raw-hlo"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["PYTHONPATH"] = str(Path(cachedoctor.__file__).parents[1])
    env["JAX_PLATFORMS"] = "cpu"
    done, stderr = run_capped(commands, env)
    assert stderr.strip() == "", stderr[-3000:]  # nothing jaxlib printed, no traceback
    for outcome in done:
        args, out, err = outcome["args"], outcome["out"], outcome["err"]
        which = next((n for n, k in keys.items() if k in args[1:3]), "the folder")
        what = f"`cachedoctor {' '.join(args)}` on {which} ({said.get(which, 'every variant')})"
        assert outcome["code"] in (0, 1), f"{what} exited {outcome['code']}: {err[-1500:]}"
        assert err == "" and "Traceback" not in out, f"{what}: {err[-1500:]}"
        if args[0] != "show":
            continue
        text = " ".join(out.split())
        refused = SAID_WHY.search(text)
        assert RENDERED in out or refused, f"{what} neither rendered the module nor said why"
        if which == "unchanged":
            assert RENDERED in out, f"the premise: {what} renders under the cap"
        if which == REPORTED:
            assert refused and "largest id" in refused.group(1), f"{what}: {text[-600:]}"
    scanned = json.loads(done[0]["out"])
    assert {e["key"] for e in scanned["entries"]} == set(keys.values())
    raw = " ".join(done[-1]["out"].split())
    assert SAID_WHY.search(raw), (
        f"diff --raw-hlo on {REPORTED} says why it has no text: {raw[-600:]}"
    )
