"""Real daemons for the tests: idemd built from this repository, started on free loopback
ports with the embedded store in a temporary directory, and over a real redis-server
when one is on the PATH (required when IDEMD_REQUIRE_REDIS is set, as in CI)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from proxy import GateProxy
from slowdown import scale

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(what: str, cond: Callable[[], bool], deadline: float = 20.0) -> None:
    """Wait for a condition, failing the test when it does not come within the deadline
    (scaled by IDEMD_TEST_SLOWDOWN)."""
    end = time.monotonic() + scale(deadline)
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


@dataclass
class Daemon:
    """A running idemd process."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """Stop the daemon by its PID and wait for it to exit."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_daemon(binary: Path, data_dir: Path, *args: str) -> Daemon:
    data_dir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{free_port()}"
    log = data_dir / "idemd.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            # Without a blob store unless args name one (a later --blob-store wins), so
            # that a result over --max-response-bytes is refused as the tests of that expect.
            [
                str(binary),
                "--listen",
                address,
                "--data-dir",
                str(data_dir),
                "--log-level",
                "warn",
                "--blob-store",
                "none",
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    daemon = Daemon(f"http://{address}", process, log)

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"idemd exited with {process.returncode}: {log.read_text()}")
        try:
            return httpx.get(daemon.url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("idemd to be ready", ready)
    except BaseException:
        daemon.kill()
        raise
    return daemon


@pytest.fixture(scope="session")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("idemd")


@pytest.fixture(scope="session")
def idemd_binary(tmp_root: Path) -> Path:
    binary = tmp_root / "idemd"
    subprocess.run(["go", "build", "-o", str(binary), "./cmd/idemd"], cwd=REPO, check=True)
    return binary


@pytest.fixture(scope="session")
def daemon(idemd_binary: Path, tmp_root: Path) -> Iterator[Daemon]:
    """One idemd with the embedded store, shared by the tests."""
    d = start_daemon(idemd_binary, tmp_root / "shared")
    yield d
    d.kill()


def redis_command(port: int, *args: str, timeout: float | None = None) -> bytes:
    """Send one command to the Redis on port and return its answer's first line (RESP),
    e.g. b"+PONG" or b":1"; timeout bounds each wait, scale(10) s unless given."""
    request = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        request += f"${len(data)}\r\n".encode() + data + b"\r\n"
    wait = scale(10) if timeout is None else timeout
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(request)
        answer = b""
        while not answer.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[int]:
    """A real redis-server on a free loopback port, without persistence, its files in
    directory; yields its port, and stops it by its PID. Without redis-server the test
    skips, or fails when IDEMD_REQUIRE_REDIS is set."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("IDEMD_REQUIRE_REDIS"):
            pytest.fail("redis-server is required (IDEMD_REQUIRE_REDIS is set) but not found")
        pytest.skip("redis-server not found; install it (apt-get install -y redis-server) to run this test")
    port = free_port()
    directory.mkdir()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--logfile",
            str(directory / "redis.log"),
        ],
    )

    def pong() -> bool:
        try:
            return redis_command(port, "PING", timeout=1) == b"+PONG"
        except OSError:
            return False

    try:
        wait_until("redis-server to answer", pong)
        yield port
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def redis_url(tmp_root: Path) -> Iterator[str]:
    """A real redis-server on a free loopback port, without persistence."""
    with redis_server(tmp_root / "redis") as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture(scope="session")
def redis_daemon(idemd_binary: Path, tmp_root: Path, redis_url: str) -> Iterator[Daemon]:
    """One idemd over the Redis store."""
    d = start_daemon(idemd_binary, tmp_root / "over-redis", "--store", redis_url)
    yield d
    d.kill()


@pytest.fixture(params=["embedded", "redis"])
def any_daemon(request: pytest.FixtureRequest) -> Daemon:
    """Each store in turn: the test runs once against each."""
    name = "daemon" if request.param == "embedded" else "redis_daemon"
    d: Daemon = request.getfixturevalue(name)
    return d


@pytest.fixture
def own_daemon(idemd_binary: Path, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start daemons for one test, which it may kill."""
    started: list[Daemon] = []

    def start(*args: str) -> Daemon:
        d = start_daemon(idemd_binary, tmp_path / f"own-{len(started)}", *args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


#: Turns the record of KEYS[1] (the strings layout) into the marker a live move leaves
#: while it hands the record over: the record's fields kept, its state m.
MARK_MOVED = """local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local l, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa = cmsgpack.unpack(v)
redis.call('SET', KEYS[1], cmsgpack.pack(l, k, t, 'm', fp, ow, at, tok, lx, rec, ca, ua, xa), 'KEEPTTL')
return 1"""


@dataclass
class Moving:
    """An idemd over a Redis of its own, with the strings layout, whose records a test
    can mark as being moved to another store (docs/moving.md, "Moving to another
    store while serving")."""

    daemon: Daemon
    port: int

    def mark(self, key: str) -> None:
        """Mark the record of key (tenant default) as being moved."""
        stored = "idem:default:" + hashlib.sha256(key.encode()).hexdigest()
        answer = redis_command(self.port, "EVAL", MARK_MOVED, "1", stored)
        assert answer == b":1", f"no record of {key!r} to mark: {answer!r}"


@pytest.fixture
def moving(idemd_binary: Path, tmp_path: Path) -> Iterator[Moving]:
    with redis_server(tmp_path / "redis") as port:
        d = start_daemon(
            idemd_binary,
            tmp_path / "over-redis",
            "--store",
            f"redis://127.0.0.1:{port}/0",
            "--redis-record-layout",
            "strings",
        )
        try:
            yield Moving(d, port)
        finally:
            d.kill()


_seq = itertools.count()


@pytest.fixture
def cut_proxy(daemon: Daemon) -> Iterator[GateProxy]:
    """A link to idemd that the test can cut."""
    proxy = GateProxy(daemon.url, hold=())
    yield proxy
    proxy.close()


def fresh_key(prefix: str) -> str:
    return f"{prefix}-{time.time_ns()}-{next(_seq)}"
