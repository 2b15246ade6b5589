"""Real local services for tests and development, on loopback only: a moto S3 server (in-process,
over HTTP) and an ``mlflow server`` subprocess (SQLite backend, artifacts proxied to S3).

    with s3_server() as s3, mlflow_server(workdir=tmp, s3=s3) as ml:
        ...  # s3.endpoint, ml.url

``python -m support.services`` (or infra/local/services.sh) starts both, prints the variables to
export and runs until Ctrl-C. Note: moto keeps its data in process-global memory, so every moto
server in one process sees the same buckets, also after a restart on the same port.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memx.pipeline.store import s3_env
from memx.pipeline.registry import seed_sqlite

LOOPBACK = "127.0.0.1"
FAKE_AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _require_loopback(host: str) -> str:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"refusing to bind {host!r}: local services listen on loopback only")
    return host


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago on `host`."""
    with socket.socket() as sock:
        sock.bind((_require_loopback(host), 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- S3 (moto)


@dataclass(frozen=True, kw_only=True)
class S3Server:
    """A running moto S3 server; `endpoint` is its http://127.0.0.1:PORT URL."""

    host: str
    port: int
    server: Any = field(repr=False, compare=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """Variables pointing every client (memx, boto3, MLflow) at this server."""
        return s3_env(self.endpoint)

    def create_buckets(self, *names: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
        for name in names:
            try:
                client.create_bucket(Bucket=name)
            except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
                pass

    def stop(self) -> None:
        self.server.stop()


def start_s3(*, host: str = LOOPBACK, port: int = 0, buckets: Sequence[str] = ("memx",)) -> S3Server:
    """Start moto's threaded S3 server on host:port (0: any free port) and create `buckets`."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=_require_loopback(host), port=port, verbose=False)
    server.start()
    bound_host, bound_port = server.get_host_and_port()
    s3 = S3Server(host=bound_host, port=bound_port, server=server)
    try:
        s3.create_buckets(*buckets)
    except BaseException:
        s3.stop()
        raise
    return s3


@contextmanager
def s3_server(*, host: str = LOOPBACK, port: int = 0, buckets: Sequence[str] = ("memx",)) -> Iterator[S3Server]:
    s3 = start_s3(host=host, port=port, buckets=buckets)
    try:
        yield s3
    finally:
        s3.stop()


# ---------------------------------------------------------------- MLflow server


@dataclass(frozen=True, kw_only=True)
class MlflowServer:
    """A running ``mlflow server`` subprocess (its own process group); logs go to `log_path`."""

    url: str
    process: subprocess.Popen = field(repr=False, compare=False)
    log_path: Path

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL it if it is still there after timeout_s."""
        _signal_group(self.process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _group_alive(self.process):
            time.sleep(0.1)
        if _group_alive(self.process):
            _signal_group(self.process, signal.SIGKILL)
        self.process.wait(timeout_s)

    @property
    def running(self) -> bool:
        return _group_alive(self.process)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # the server was started as a session leader: pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(process: subprocess.Popen) -> bool:
    """True while the server or any process it started (the uvicorn worker) is still there."""
    process.poll()  # reap the leader if it has exited
    try:
        os.killpg(process.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def mlflow_command(*, host: str, port: int, backend_store_uri: str, artifacts_destination: str) -> list[str]:
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", backend_store_uri,
        "--artifacts-destination", artifacts_destination,
        "--host", host, "--port", str(port), "--workers", "1",
    ]  # fmt: skip


def mlflow_env(s3_endpoint: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ours, the S3 endpoint variables, no job-execution side process
    (it doubles start-up time and tests need none)."""
    env = dict(os.environ)
    env.update(s3_env(s3_endpoint))
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    env.update(extra or {})
    return env


def start_mlflow(
    *,
    workdir: str | Path,
    s3: S3Server | None = None,
    artifacts_destination: str | None = None,
    backend_store_uri: str | None = None,
    host: str = LOOPBACK,
    port: int = 0,
    timeout_s: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> MlflowServer:
    """Start ``mlflow server`` in `workdir`: SQLite backend there (default), artifacts to
    ``s3://memx/mlflow`` on the `s3` server (default when given) or `artifacts_destination`.
    Waits until /health answers; raises RuntimeError (with the log's tail) if it does not."""
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    destination = artifacts_destination or ("s3://memx/mlflow" if s3 else str(workdir / "artifacts"))
    backend_store_uri = backend_store_uri or f"sqlite:///{workdir / 'mlflow.db'}"
    seed_sqlite(backend_store_uri)  # a migrated empty store, as memx's own SQLite stores start
    cmd = mlflow_command(
        host=_require_loopback(host),
        port=port,
        backend_store_uri=backend_store_uri,
        artifacts_destination=destination,
    )
    log_path = workdir / "mlflow-server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=mlflow_env(s3.endpoint if s3 else None, env), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = MlflowServer(url=f"http://{host}:{port}", process=proc, log_path=log_path)
    try:
        wait_healthy(server, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def wait_healthy(server: MlflowServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {server.process.returncode}:\n{server.log_tail()}")
        if _healthy(f"{server.url}/health"):
            return
        time.sleep(0.25)
    raise RuntimeError(f"mlflow server not healthy after {timeout_s:.0f} s:\n{server.log_tail()}")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback http only
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


@contextmanager
def mlflow_server(**kwargs: Any) -> Iterator[MlflowServer]:
    """Context manager around :func:`start_mlflow` (same keyword arguments)."""
    server = start_mlflow(**kwargs)
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- both, for development


@dataclass(frozen=True, kw_only=True)
class LocalServices:
    s3: S3Server
    mlflow: MlflowServer
    bucket: str

    def env(self) -> dict[str, str]:
        return {
            **FAKE_AWS_ENV,
            **self.s3.env(),
            "MLFLOW_TRACKING_URI": self.mlflow.url,
            "MEMX_STORE": f"s3://{self.bucket}/artifacts",
        }


@contextmanager
def local_services(*, workdir: str | Path, bucket: str = "memx", s3_port: int = 0, mlflow_port: int = 0) -> Iterator[LocalServices]:
    """Moto S3 (bucket created) + MLflow server with artifacts in s3://BUCKET/mlflow; the server
    gets fake credentials (moto takes any key; real ones must never be sent to it)."""
    with ExitStack() as stack:
        s3 = stack.enter_context(s3_server(port=s3_port, buckets=(bucket,)))
        ml = stack.enter_context(
            mlflow_server(workdir=workdir, s3=s3, port=mlflow_port, artifacts_destination=f"s3://{bucket}/mlflow", env=FAKE_AWS_ENV)
        )
        yield LocalServices(s3=s3, mlflow=ml, bucket=bucket)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.services", description="Moto S3 + MLflow server on 127.0.0.1 until Ctrl-C.")
    parser.add_argument("--dir", type=Path, default=None, help="MLflow SQLite DB and log folder (default: a temp dir).")
    parser.add_argument("--bucket", default="memx")
    parser.add_argument("--s3-port", type=int, default=0, help="0: any free port")
    parser.add_argument("--mlflow-port", type=int, default=0, help="0: any free port")
    parser.add_argument("--verbose", action="store_true", help="Log every S3 request.")
    args = parser.parse_args(argv)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="memx-services-"))
    if not args.verbose:
        import logging

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        with local_services(workdir=workdir, bucket=args.bucket, s3_port=args.s3_port, mlflow_port=args.mlflow_port) as svc:
            print(f"# memx local services (MLflow log: {svc.mlflow.log_path}); Ctrl-C stops them", flush=True)
            for key, value in svc.env().items():
                print(f"export {key}={value}", flush=True)
            while svc.mlflow.process.poll() is None:
                time.sleep(0.5)
            print(f"mlflow server exited:\n{svc.mlflow.log_tail()}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def listening_hosts(port: int) -> set[str]:
    """The IPv4/IPv6 addresses with a socket listening on `port` (from /proc/net/tcp{,6}): what a
    service actually bound, not what it was asked for."""
    hosts = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port and len(addr) == width:  # 0A: LISTEN
                raw = bytes.fromhex(addr)
                if width == 8:
                    hosts.add(str(ipaddress.IPv4Address(raw[::-1])))
                else:  # four little-endian 32-bit words
                    hosts.add(str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))))
    return hosts
