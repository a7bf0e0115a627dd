"""Write the option schema of each jaxlib wheel into the package (``xla/schemas/``).

    python tools/ship_schemas.py WHEEL [WHEEL ...]     # e.g. from `pip download jaxlib==X
                                                       #   --no-deps --only-binary :all:`

A fresh machine has no kept schema (``xla/schema_memo.py``) and its jaxlib library is cold, so
reading the names from it there costs seconds. For each wheel this takes jaxlib's largest shared
library and its ``RECORD`` out of the wheel, reads the descriptors with the code a scan uses
(``optionschema``), and writes ``<the RECORD's sha256 of the library>.json.zst``: the table a
scan then uses wherever the installed ``RECORD`` names that digest at that size. The test suite
checks the installed jaxlib's table against its own library in every compat session.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import zstandard

from cachedoctor.xla import optionschema, schema_memo


def _largest_library(wheel: zipfile.ZipFile) -> zipfile.ZipInfo:
    libraries = [
        i for i in wheel.infolist() if i.filename.startswith("jaxlib/") and ".so" in i.filename
    ]
    if not libraries:
        raise SystemExit(f"{wheel.filename}: no jaxlib/*.so in this wheel")
    return max(libraries, key=lambda i: i.file_size)


def _record_digest(wheel: zipfile.ZipFile, name: str) -> tuple[str, str]:
    """(the RECORD's sha256 of ``name``, the dist-info folder's name)."""
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    for row in csv.reader(io.StringIO(wheel.read(record).decode())):
        if row and row[0] == name and row[1].startswith("sha256="):
            return row[1].removeprefix("sha256="), record.split("/")[0]
    raise SystemExit(f"{wheel.filename}: RECORD does not name {name}")


def ship(wheel_path: Path, out: Path) -> Path:
    """The table of one wheel, written into ``out``."""
    with zipfile.ZipFile(wheel_path) as wheel, tempfile.TemporaryDirectory() as tmp:
        info = _largest_library(wheel)
        digest, dist_info = _record_digest(wheel, info.filename)
        (Path(tmp) / dist_info).mkdir()  # optionschema names the version from the dist-info
        library = Path(wheel.extract(info, tmp))
        messages, enums, found = optionschema.read_descriptors(library)
        if "xla/xla.proto" not in found or not any("compile_options" in f for f in found):
            raise SystemExit(f"{wheel_path.name}: no option descriptors in {info.filename}")
        keep, keep_enums = optionschema._reachable(messages, optionschema.ROOT_MESSAGES)
        schema = optionschema.Schema(
            messages={k: v for k, v in messages.items() if k in keep},
            enums={k: v for k, v in enums.items() if k in keep_enums},
            source=f"jaxlib {optionschema._version_of(library)} ({library.name})",
        )
    doc = {"format": schema_memo.FORMAT, "record": digest, **optionschema._doc_of(schema)}
    data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    target = out / f"{digest}.json.zst"
    target.write_bytes(zstandard.ZstdCompressor(level=19).compress(data))
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=schema_memo.SHIPPED)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for wheel in args.wheels:
        target = ship(wheel, args.out)
        print(f"{wheel.name}: {target.name} ({target.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
