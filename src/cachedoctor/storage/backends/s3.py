"""S3 (``s3://``) through s3fs, as JAX's etils.epath reaches it.

Versions are ETags (quotes stripped); a delete carries ``If-Match`` and a server that rejects it
as unsupported gets a fresh check, then a plain delete. Errors are botocore's codes, read from the
``ClientError`` that s3fs raises its OSError from.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import Any

from cachedoctor.storage.backends.base import Failure, Op

_UNSUPPORTED = Failure.UNSUPPORTED


def _norm_etag(etag: object) -> str | None:
    return str(etag).strip('"') if etag else None


@functools.cache
def _with_listing_index(cls: Any) -> Any:
    class CachedoctorS3FileSystem(cls):  # type: ignore[misc]
        def _ls_from_cache(self, path: str) -> Any:
            # fsspec's own rules, bar the scan: the path's own listing, else the parent's
            # listing's entries of that name (FileNotFoundError when it has none)
            told = self._cachedoctor_index.told(path)
            if told is not None:
                return [told]
            stripped = path.rstrip("/")
            with contextlib.suppress(KeyError):
                return self.dircache[stripped]
            if stripped != path:
                return super()._ls_from_cache(path)
            parent = self._parent(path)
            try:
                listing = self.dircache[parent]
            except KeyError:
                return None
            found = self._cachedoctor_index.named(parent, listing, path)
            if not found:
                raise FileNotFoundError(path)
            return list(found)

    return CachedoctorS3FileSystem


class S3Backend:
    """``s3://bucket/prefix``: s3fs, ETags, ``If-Match`` / ``If-None-Match``."""

    scheme = "s3"
    article = "an"
    package = "s3fs"
    extra = "s3"
    endpoint_variables: tuple[str, ...] = (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
    )
    strip_listed_names = False
    failures: Mapping[Op, Mapping[str, Failure]] = {
        Op.HEAD: {"NoSuchKey": Failure.GONE, "404": Failure.GONE, "NotFound": Failure.GONE},
        Op.CREATE: {"NotImplemented": _UNSUPPORTED, "501": _UNSUPPORTED},
        Op.DELETE: {
            "PreconditionFailed": Failure.CHANGED,
            "NoSuchKey": Failure.GONE,
            "404": Failure.GONE,
            "NotImplemented": _UNSUPPORTED,
            "InvalidArgument": _UNSUPPORTED,
            "501": _UNSUPPORTED,
        },
    }

    def filesystem_class(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem

    def adapt(self, cls: Any) -> Any:
        return _with_listing_index(cls)

    def new_filesystem(self, cls: Any) -> Any:
        fs = cls(skip_instance_cache=True, config_kwargs={"retries": {"total_max_attempts": 1}})
        fs.retries = 1  # s3fs's own loop around botocore
        return fs

    def version_of(self, info: Mapping[str, Any]) -> str | None:
        return _norm_etag(info.get("ETag"))

    def listed_fields(self, path: str, size: int, version: str) -> dict[str, Any]:
        return {"Key": path, "Size": size, "ETag": f'"{version}"'}

    def head_version(self, fs: Any, bucket: str, key: str) -> str | None:
        return _norm_etag(fs.call_s3("head_object", Bucket=bucket, Key=key)["ETag"])

    def delete(self, fs: Any, bucket: str, key: str, version: str | None) -> None:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if version:
            kwargs["IfMatch"] = f'"{version}"'
        fs.call_s3("delete_object", **kwargs)

    def error_code(self, exc: BaseException) -> str | None:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):  # botocore's ClientError
            return str((response.get("Error") or {}).get("Code") or "")
        if isinstance(exc, FileNotFoundError):  # s3fs's translation of a 404
            return "NoSuchKey"
        return None


BACKEND = S3Backend()
