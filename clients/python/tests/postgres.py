"""A real PostgreSQL for the tests: initdb into a directory of its own, postgres on a free
loopback port (as the postgres user when the tests run as root, since initdb refuses
root), stopped by its PID. Without PostgreSQL installed the tests skip, unless
IDEMD_REQUIRE_POSTGRES is set (as .ci/run does), which turns the skip into a failure."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from conftest import free_port
from slowdown import scale

NOT_INSTALLED = "PostgreSQL not installed (apt-get install postgresql)"


def bin_dir() -> Path | None:
    """Where initdb and postgres are: the PATH, else the newest of Debian's
    /usr/lib/postgresql/N/bin, which its package does not put on the PATH."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("postgres"):
        return Path(initdb).parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return versions[-1].parent if versions else None


@dataclass
class Postgres:
    """A running PostgreSQL; ``url`` connects to the database postgres as postgres."""

    url: str
    process: subprocess.Popen[bytes]
    directory: Path

    def stop(self) -> None:
        """A fast shutdown (SIGINT; SIGKILL after 30 s), then remove the directory."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(scale(30))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start() -> Postgres:
    """Run initdb and postgres; return once the server accepts connections. Skips the
    test without PostgreSQL, or fails it when IDEMD_REQUIRE_POSTGRES is set."""
    binaries = bin_dir()
    if binaries is None:
        if os.environ.get("IDEMD_REQUIRE_POSTGRES"):
            pytest.fail(f"PostgreSQL is required (IDEMD_REQUIRE_POSTGRES is set): {NOT_INSTALLED}")
        pytest.skip(NOT_INSTALLED)
    directory = Path(tempfile.mkdtemp(prefix="idemd-pg-"))
    user: dict[str, int] = {}
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        user = {"user": entry.pw_uid, "group": entry.pw_gid}
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    data = directory / "data"
    subprocess.run(
        [
            binaries / "initdb",
            "-D",
            data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ],
        check=True,
        capture_output=True,
        **user,  # type: ignore[call-overload]
    )
    # A port found free may be taken before postgres binds it: try a few.
    for tries in range(5):
        port = free_port()
        log = directory / f"postgres-{tries}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    binaries / "postgres",
                    "-D",
                    data,
                    "-p",
                    str(port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    directory,
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                **user,  # type: ignore[call-overload]
            )
        server = Postgres(f"postgresql://postgres@127.0.0.1:{port}/postgres", process, directory)
        end = time.monotonic() + scale(30)
        while process.poll() is None:
            try:
                psycopg.connect(server.url, connect_timeout=1).close()
                return server
            except psycopg.OperationalError:
                pass
            if time.monotonic() > end:
                server.stop()
                pytest.fail(f"postgres did not accept connections within 30 s: {log.read_text()}")
            time.sleep(0.02)
        text = log.read_text()
        if "could not bind" not in text and "could not create any TCP/IP sockets" not in text:
            break
    shutil.rmtree(directory, ignore_errors=True)
    pytest.fail(f"postgres exited: {text}")
