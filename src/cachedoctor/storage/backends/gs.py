"""Google Cloud Storage (``gs://``) through gcsfs, as JAX's etils.epath reaches it.

Versions are generations; a delete and a create-only write carry ``ifGenerationMatch``. gcsfs
raises FileNotFoundError for 404 and FileExistsError for 412 (a failed precondition).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from cachedoctor.storage.backends.base import Failure, Op


@functools.cache
def _adapted(cls: Any) -> Any:
    request = getattr(cls, "_request", None)
    unwrapped = getattr(request, "__wrapped__", None)
    if unwrapped is not None:  # gcsfs wraps _request in retry_request(retries=6)
        cls = type("CachedoctorGCSRequests", (cls,), {"_request": unwrapped})

    class CachedoctorGCSFileSystem(cls):  # type: ignore[misc]
        async def _info(self, path: str, generation: Any = None, **kwargs: Any) -> Any:
            # gcsfs's first answer, bar the scan: the first entry of the parent's cached listing
            # with this name; anything else (a generation, no listing, no entry) is gcsfs's
            stripped = self._strip_protocol(path).rstrip("/")
            told = self._cachedoctor_index.told(stripped)
            if told is not None and generation is None:
                return told
            if "/" in stripped and generation is None:
                bucket, key, path_generation = self.split_path(stripped)
                parent = self._parent(stripped)
                listing = self._ls_from_cache(parent)
                if listing and not path_generation:
                    found = self._cachedoctor_index.named(parent, listing, f"{bucket}/{key}")
                    if found:
                        return found[0]
            return await super()._info(path, generation=generation, **kwargs)

    return CachedoctorGCSFileSystem


class GcsBackend:
    """``gs://bucket/prefix``: gcsfs, generations, ``ifGenerationMatch``."""

    scheme = "gs"
    article = "a"
    package = "gcsfs"
    extra = "gcs"
    endpoint_variables: tuple[str, ...] = (
        "STORAGE_EMULATOR_HOST",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
    )
    strip_listed_names = True  # gcsfs compares names without a trailing slash
    failures: Mapping[Op, Mapping[str, Failure]] = {
        Op.HEAD: {"404": Failure.GONE},
        Op.CREATE: {},
        Op.DELETE: {"412": Failure.CHANGED, "404": Failure.GONE},
    }

    def filesystem_class(self) -> Any:
        import gcsfs

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            # An emulator speaks the JSON API only; gcsfs's extended class would first probe
            # the bucket type over gRPC, which an emulator does not serve (a 60 s stall).
            from gcsfs.core import GCSFileSystem

            return GCSFileSystem
        return gcsfs.GCSFileSystem

    def adapt(self, cls: Any) -> Any:
        return _adapted(cls)

    def new_filesystem(self, cls: Any) -> Any:
        return cls(skip_instance_cache=True)

    def version_of(self, info: Mapping[str, Any]) -> str | None:
        generation = info.get("generation")
        return str(generation) if generation is not None else None

    def listed_fields(self, path: str, size: int, version: str) -> dict[str, Any]:
        return {"generation": version}

    def head_version(self, fs: Any, bucket: str, key: str) -> str | None:
        from fsspec.asyn import sync

        found = sync(fs.loop, fs._call, "GET", "b/{}/o/{}", bucket, key, json_out=True)
        return str(found["generation"])

    def delete(self, fs: Any, bucket: str, key: str, version: str | None) -> None:
        from fsspec.asyn import sync

        params = {"ifGenerationMatch": version} if version else {}
        sync(fs.loop, fs._call, "DELETE", "b/{}/o/{}", bucket, key, **params)

    def error_code(self, exc: BaseException) -> str | None:
        if isinstance(exc, FileExistsError):  # gcsfs's 412 Precondition Failed
            return "412"
        if isinstance(exc, FileNotFoundError):  # gcsfs's 404
            return "404"
        return None


BACKEND = GcsBackend()
