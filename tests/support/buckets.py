"""Local S3 and GCS servers for the tests (and the bucket benchmark): addresses, the environment a
user sets to point JAX at them, and a proxy that forwards to one, refusing every N-th request
as a throttled service would. Everything binds 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.storage import remote_store, stores
from cachedoctor.storage.remote_store import RemoteStore

S3_BUCKET = "cachedoctor-s3"


GCS_BUCKET = "cachedoctor-gcs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Servers:
    s3_port: int
    gcs_port: int
    env: dict[str, str]

    def url(self, scheme: str, prefix: str) -> str:
        return f"{scheme}://{S3_BUCKET if scheme == 's3' else GCS_BUCKET}/{prefix}"


def server_env(s3_port: int, gcs_port: int) -> dict[str, str]:
    """What a user sets to point JAX and cachedoctor at these servers (and at nothing else)."""
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance-metadata address
        "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{gcs_port}",
        "FSSPEC_GCS_TOKEN": "anon",
        "NO_GCE_CHECK": "true",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # the emulator serves no gRPC
    }


@dataclass
class Proxy:
    """Forwards to a server on 127.0.0.1; every ``every``-th request is refused instead."""

    upstream: int
    every: int
    status: int = 0
    body: bytes = b""
    content_type: str = ""
    fix_multipart: bool = False  # see _as_media_upload
    requests: int = 0
    throttled: int = 0
    log: list[tuple[str, str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self) -> bool:
        if self.every <= 0:
            return False
        with self.lock:
            self.requests += 1
            refuse = self.requests % self.every == 0
            self.throttled += refuse
            return refuse


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _handle(self) -> None:
            body = self._body()
            path, content_type = self.path, self.headers.get("Content-Type", "")
            if proxy.fix_multipart and "uploadType=multipart" in path:
                path, body, content_type = _as_media_upload(path, body, content_type)
            if proxy.decide():
                proxy.log.append((self.command, self.path, proxy.status))
                self.send_response(proxy.status)
                self.send_header("Content-Type", proxy.content_type)
                self.send_header("Content-Length", str(len(proxy.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(proxy.body)
                return
            skip = {"connection", "transfer-encoding", "content-length", "keep-alive"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
            headers["Content-Length"] = str(len(body))
            if content_type:
                headers["Content-Type"] = content_type
            resp, data = _forward(proxy.upstream, self.command, path, body, headers)
            proxy.log.append((self.command, self.path, resp.status))
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in skip:
                    self.send_header(k, v)
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

    return Handler


def _forward(
    port: int, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[http.client.HTTPResponse, bytes]:
    """One request to the server behind the proxy.

    The GCS emulator serves one request at a time with a short listen queue, so under a pool of
    clients a connection is sometimes refused or dropped: try again (bounded) rather than pass
    a failure the real service would not produce on to the client.
    """
    for attempt in range(20):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp, resp.read()
        except (ConnectionError, http.client.HTTPException):
            if attempt == 19:
                raise
            time.sleep(0.05)
        finally:
            conn.close()
    raise AssertionError("unreachable")


def _as_media_upload(path: str, body: bytes, content_type: str) -> tuple[str, bytes, str]:
    """Turn a multipart upload into a media upload of the same bytes.

    gcp-storage-emulator parses multipart bodies with Python's email parser, which rewrites
    line endings inside binary content: about one cache entry in twenty came back a byte
    short. Real GCS does not; a media upload stores the body as sent.
    """
    boundary = content_type.split("boundary=", 1)[1].strip().strip('"').encode()
    parts = body.split(b"--" + boundary)

    def split_part(part: bytes) -> tuple[bytes, bytes]:
        nl = b"\r\n" if part.startswith(b"\r\n") else b"\n"  # gcsfs writes bare LFs
        head, content = part.split(nl + nl, 1)
        return head, content.removesuffix(nl)  # the line break belongs to the delimiter

    meta = json.loads(split_part(parts[1])[1])
    head, data = split_part(parts[2])
    part_type = "application/octet-stream"
    for line in head.decode().splitlines():
        if line.lower().startswith("content-type:"):
            part_type = line.split(":", 1)[1].strip()
    base, _, query = path.partition("?")
    params = [q for q in query.split("&") if q and not q.startswith(("uploadType=", "name="))]
    params += ["uploadType=media", "name=" + urllib.parse.quote(meta["name"], safe="")]
    return f"{base}?{'&'.join(params)}", data, part_type


@contextlib.contextmanager
def serve(proxy: Proxy) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def throttling_proxy(scheme: str, servers: Servers, every: int) -> Iterator[tuple[Proxy, str]]:
    if scheme == "s3":
        proxy = Proxy(
            servers.s3_port,
            every,
            503,
            b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
            b"<Message>Please reduce your request rate.</Message></Error>",
            "application/xml",
        )
    else:
        proxy = Proxy(
            servers.gcs_port,
            every,
            429,
            json.dumps({"error": {"code": 429, "message": "rate limit exceeded"}}).encode(),
            "application/json",
            fix_multipart=True,
        )
    with serve(proxy) as endpoint:
        yield proxy, endpoint


def filesystem(scheme: str) -> Any:
    return remote_store._make_filesystem(scheme)


def upload(url: str, local: Path) -> None:
    store = stores.open_store(url)
    assert isinstance(store, RemoteStore)
    store.map(
        lambda path: store.write_atomic(path.name, path.read_bytes()),
        [p for p in sorted(local.iterdir()) if p.is_file()],
    )


@contextlib.contextmanager
def running_servers() -> Iterator[Servers]:
    """moto's S3 server (bucket ``S3_BUCKET``) and the GCS emulator (``GCS_BUCKET``, behind a
    proxy that fixes its multipart uploads), with this process's environment pointing at them.

    Skips the calling test, saying why, when the ``test-remote`` extra is not installed.
    """
    moto_server = pytest.importorskip(
        "moto.moto_server.threaded_moto_server", reason="moto[server] not installed (test-remote)"
    )
    gcs_server = pytest.importorskip(
        "gcp_storage_emulator.server", reason="gcp-storage-emulator not installed (test-remote)"
    )
    pytest.importorskip("s3fs", reason="s3fs not installed (cachedoctor[s3])")
    pytest.importorskip("gcsfs", reason="gcsfs not installed (cachedoctor[gcs])")
    s3_port, gcs_port = free_port(), free_port()
    moto = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    gcs = gcs_server.create_server("127.0.0.1", gcs_port, in_memory=True, default_bucket=GCS_BUCKET)
    import fsspec.config

    gcs_conf = fsspec.config.conf.setdefault("gcs", {})
    with (
        serve(Proxy(gcs_port, every=0, fix_multipart=True)) as gcs_endpoint,
        pytest.MonkeyPatch.context() as mp,
    ):
        env = server_env(s3_port, int(gcs_endpoint.rsplit(":", 1)[1]))
        for k, v in env.items():
            mp.setenv(k, v)
        mp.setitem(gcs_conf, "token", "anon")  # fsspec read FSSPEC_GCS_TOKEN at its import
        moto.start()
        gcs.start()
        try:
            # moto keeps its buckets per process, not per server: an earlier module's server in
            # this process (an xdist worker) may have made it already
            with contextlib.suppress(FileExistsError):
                filesystem("s3").mkdir(S3_BUCKET)
            yield Servers(s3_port, gcs_port, env)
        finally:
            gcs.stop()
            moto.stop()
