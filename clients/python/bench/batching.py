"""Measures what natural batching saves: concurrent workers each claim a fresh key and
complete it, through one client with batching off and then on, in the same run and
against the same idemd, round after round. It reports calls per second, HTTP requests
per call, and the CPU per call of this process and of idemd (from /proc/<pid>/stat).
It is a command, not a test:

    cd clients/python && PYTHONPATH=src .venv/bin/python bench/batching.py \\
        [--client threads|asyncio] [--calls 8000] [--workers 64] [--rounds 3] [-- idemd flags]

Workers are threads sharing an idemd.Client, or tasks sharing an idemd.AsyncClient. It
builds ./cmd/idemd itself unless IDEMD_BIN names a binary, starts it on a free loopback
port with its embedded store in a temporary directory (or the store the idemd flags
after -- name), and stops it by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

import idemd

REPO = Path(__file__).resolve().parents[3]


def cpu_of(pid: int) -> float:
    """User plus system CPU time of a process, in seconds."""
    # Fields 14 and 15 of /proc/<pid>/stat, after the command name in parentheses.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_idemd(binary: str, data_dir: str, flags: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir, "--log-level", "warn", *flags],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(1000):
        if process.poll() is not None:
            raise SystemExit(f"idemd exited with {process.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return url, process
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    process.kill()
    raise SystemExit("idemd was not ready within 20 s")


def threads_phase(url: str, batching: bool, prefix: str, calls: int, workers: int) -> int:
    """Runs the phase with threads; returns how many HTTP requests it made."""
    requests = itertools.count()
    client = idemd.Client(url, batching=batching)

    def count(_: httpx.Request) -> None:
        next(requests)

    client._api.get_httpx_client().event_hooks["request"].append(count)
    keys = iter(range(calls // 2))
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            while True:
                with lock:
                    n = next(keys, None)
                if n is None:
                    return
                key = f"{prefix}-{n}"
                claim = client.claim(key)
                client.complete(key, claim.token, idemd.Response(201, body=b"made"))
        except BaseException as err:
            failures.append(err)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    if failures:
        raise failures[0]
    return next(requests)


def asyncio_phase(url: str, batching: bool, prefix: str, calls: int, workers: int) -> int:
    """Runs the phase with tasks on one event loop; returns how many HTTP requests it made."""
    requests = itertools.count()

    async def main() -> None:
        client = idemd.AsyncClient(url, batching=batching)

        async def count(_: httpx.Request) -> None:
            next(requests)

        client._api.get_async_httpx_client().event_hooks["request"].append(count)
        keys = iter(range(calls // 2))

        async def worker() -> None:
            for n in keys:
                key = f"{prefix}-{n}"
                claim = await client.claim(key)
                await client.complete(key, claim.token, idemd.Response(201, body=b"made"))

        await asyncio.gather(*(worker() for _ in range(workers)))
        await client.aclose()

    asyncio.run(main())
    return next(requests)


def main() -> None:
    own, flags = sys.argv[1:], []
    if "--" in own:
        split = own.index("--")
        own, flags = own[:split], own[split + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=["threads", "asyncio"], default="threads")
    parser.add_argument("--calls", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(own)
    run: Callable[[str, bool, str, int, int], int] = (
        threads_phase if args.client == "threads" else asyncio_phase
    )

    with tempfile.TemporaryDirectory(prefix="idemd-py-bench-") as tmp:
        binary = os.environ.get("IDEMD_BIN")
        if not binary:
            binary = str(Path(tmp) / "idemd")
            subprocess.run(["go", "build", "-o", binary, "./cmd/idemd"], cwd=REPO, check=True)
        url, process = start_idemd(binary, str(Path(tmp) / "data"), flags)
        try:
            print(
                f"{args.calls} calls a phase (claim and complete of fresh keys), "
                f"{args.workers} {args.client} workers, {args.rounds} rounds, Python {sys.version.split()[0]}"
            )
            for round_ in range(1, args.rounds + 1):
                print(f"round {round_}")
                for batching in (False, True):
                    idemd_before, own_before = cpu_of(process.pid), time.process_time()
                    start = time.perf_counter()
                    requests = run(url, batching, f"bench-{round_}-{batching}", args.calls, args.workers)
                    seconds = time.perf_counter() - start
                    own_cpu, idemd_cpu = time.process_time() - own_before, cpu_of(process.pid) - idemd_before
                    n = args.calls // 2 * 2
                    print(
                        f"  batching {'on ' if batching else 'off'}  {n / seconds:.0f} calls/s  "
                        f"{requests / n:.3f} requests/call  client {own_cpu / n * 1e6:.0f} µs/call  "
                        f"idemd {idemd_cpu / n * 1e6:.0f} µs/call"
                    )
        finally:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
