"""Fixtures for the storage tests: moto's S3 server on a free loopback port, buckets, a TCP proxy that
can make the endpoint go away and come back, and the S3 environment of one test.

The servers run as separate processes in their own session with default signal handlers, and are
stopped by their own pid (never by name).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mooncake-test", "AWS_SECRET_ACCESS_KEY": "mooncake-test-secret"}
_S3_ENV = (
    "MOONCAKE_S3_ENDPOINT",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "MOONCAKE_S3_REGION",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "MOONCAKE_S3_ALLOW_HTTP",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "MOONCAKE_WAREHOUSE",
    "MOONCAKE_CATALOG_URI",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_signals():  # child side: the test runner's environment may ignore SIGTERM/SIGINT
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


@dataclass
class MotoServer:
    """A running ``python -m moto.server`` on 127.0.0.1."""

    port: int
    proc: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **creds):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=creds.get("key", CREDENTIALS["AWS_ACCESS_KEY_ID"]),
            aws_secret_access_key=creds.get("secret", CREDENTIALS["AWS_SECRET_ACCESS_KEY"]),
        )

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"mc-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out, token = [], None
        c = self.client()
        while True:
            kw = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
            page = c.list_objects_v2(**kw)
            out += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return out
            token = page["NextContinuationToken"]

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a process we started, by its own pid: SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


def start_moto(env_extra: dict | None = None, timeout: float = 60.0) -> MotoServer:
    port = free_port()
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=_default_signals,
    )
    server = MotoServer(port, proc)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=1).read()
            return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"moto server did not answer on {server.endpoint} within {timeout}s")


@pytest.fixture(scope="session")
def moto_server():
    """moto's S3 server for the whole session (buckets are per test)."""
    server = start_moto()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def moto_auth_server():
    """A moto server that checks credentials from the first request on (any key we send is unknown)."""
    server = start_moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    yield server
    server.stop()


@pytest.fixture()
def s3_env(monkeypatch):
    """Credentials in the environment (the service inherits them); no stray endpoint/warehouse settings."""
    for k in _S3_ENV:
        monkeypatch.delenv(k, raising=False)
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    return dict(CREDENTIALS)


@pytest.fixture()
def s3_bucket(moto_server, s3_env) -> str:
    """A fresh bucket on the session's moto server."""
    return moto_server.create_bucket()


class TcpProxy:
    """A loopback TCP forwarder on a fixed port: ``stop()`` makes the endpoint go away (connections are
    refused and open ones reset), ``start()`` brings it back on the same port. Used to take the S3
    endpoint away while moto (which keeps its objects in memory) stays up."""

    def __init__(self, target_port: int, port: int | None = None):
        self.target_port = target_port
        self.port = port or free_port()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        lst = socket.socket()
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", self.port))
        lst.listen(64)
        self._listener = lst
        self._thread = threading.Thread(target=self._accept, args=(lst,), daemon=True)
        self._thread.start()

    def _accept(self, lst: socket.socket) -> None:
        while True:
            try:
                client, _ = lst.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)

    def stop(self) -> None:
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
                s.close()
            except OSError:
                pass


@pytest.fixture()
def s3_proxy(moto_server):
    proxy = TcpProxy(moto_server.port)
    proxy.start()
    yield proxy
    proxy.stop()


# ------------------------------------------------------------------ GCS and Azure emulators
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AZURITE = os.path.join(ROOT, ".venv", "node", "node_modules", ".bin", "azurite-blob")
# Azurite's well-known development account (public, documented by Microsoft; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_STORE_ENV = (
    "MOONCAKE_GCS_ENDPOINT",
    "STORAGE_EMULATOR_HOST",
    "MOONCAKE_GCS_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "MOONCAKE_GCS_PROJECT",
    "GOOGLE_CLOUD_PROJECT",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "MOONCAKE_AZURE_ENDPOINT",
    "MOONCAKE_WAREHOUSE",
    "MOONCAKE_CATALOG_URI",
)


def azurite_connection_string(port: int, key: str = AZURITE_KEY) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )


def _wait_port(proc: subprocess.Popen, port: int, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    stop_process(proc)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


@dataclass
class Emulator:
    """A store emulator process on 127.0.0.1:``port``."""

    port: int
    proc: subprocess.Popen
    kind: str

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """``gcp-storage-emulator`` (PyPI) in memory on a free loopback port, for the session."""
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    proc = subprocess.Popen(
        [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory", "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_default_signals,
        cwd=str(tmp_path_factory.mktemp("gcs")),
    )
    _wait_port(proc, port, "gcp-storage-emulator")
    em = Emulator(port, proc, "gcs")
    yield em
    em.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """Azurite's blob service (npm ``azurite``, installed by ``make install``) in memory on a free
    loopback port, telemetry off, for the session."""
    if not os.path.exists(AZURITE):
        pytest.fail(f"{AZURITE} is missing: run `make install` (it installs Azurite from npm)")
    port = free_port()
    loc = tmp_path_factory.mktemp("azurite")
    proc = subprocess.Popen(
        [
            AZURITE,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--inMemoryPersistence",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_default_signals,
        cwd=str(loc),
    )
    _wait_port(proc, port, "azurite")
    em = Emulator(port, proc, "azure")
    yield em
    em.stop()


@pytest.fixture()
def store_env(monkeypatch):
    """No stray GCS/Azure/S3 settings from the caller's environment."""
    for k in _STORE_ENV + _S3_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # google-auth never probes a metadata server from the tests
    return monkeypatch


def new_name() -> str:
    return f"mc-{uuid.uuid4().hex[:12]}"
