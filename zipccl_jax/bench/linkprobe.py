"""The shaped link without JAX: two hosts of bench net's network exchange a
buffer both ways at once over one plain TCP connection, after an idle gap
(as a sync follows a training step), and the median time is printed per
size. It tells the link's own behaviour from the collectives' transport:

    sudo python -m zipccl_jax.bench.linkprobe --rate 200mbit --sizes 340000,493000

(root and iproute2, as bench net). docs/BENCHMARKS.md has its figures.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from . import netns

PORT = 5555


def _recv(sock: socket.socket, n: int) -> None:
    while n > 0:
        got = sock.recv(min(1 << 20, n))
        if not got:
            raise ConnectionError("zipccl linkprobe: the peer closed the connection")
        n -= len(got)


def peer(role: str, address: str, size: int, repeat: int, gap_ms: float) -> list[float]:
    """One side of the exchange; returns its times in seconds."""
    if role == "server":
        with socket.create_server((address, PORT)) as listener:
            sock, _ = listener.accept()
    else:
        deadline = time.monotonic() + 30
        while True:
            try:
                sock = socket.create_connection((address, PORT), timeout=30)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload, times = b"\0" * size, []
    with sock:
        for _ in range(repeat):
            sock.sendall(b"b")  # a barrier, then the idle gap, then both start together
            _recv(sock, 1)
            time.sleep(gap_ms / 1e3)
            sock.sendall(b"c")
            _recv(sock, 1)
            start = time.perf_counter()
            sender = threading.Thread(target=sock.sendall, args=(payload,))
            sender.start()
            _recv(sock, size)
            sender.join()
            times.append(time.perf_counter() - start)
    return times


def probe(rate: str, sizes: list[int], repeat: int = 40, gap_ms: float = 25) -> dict[int, list[float]]:
    """{size: [median, p25, p75] ms} of the exchange over a 2-host network at rate."""
    result = {}
    # cwd away from any source checkout (as bench net's workers): `python -m` puts cwd first on sys.path
    with netns.Network(2) as net, tempfile.TemporaryDirectory() as cwd:
        net.set_rate(rate)
        for size in sizes:
            args = [net.address(0), str(size), str(repeat), str(gap_ms)]
            command = [sys.executable, "-m", "zipccl_jax.bench.linkprobe", "--peer"]
            server = subprocess.Popen(net.exec(0, [*command, "server", *args]), stdout=subprocess.PIPE, text=True,
                                      cwd=cwd)
            client = subprocess.Popen(net.exec(1, [*command, "client", *args]), stdout=subprocess.DEVNULL, cwd=cwd)
            try:
                out, _ = server.communicate(timeout=60 + repeat * (gap_ms / 1e3 + 1))
                failed = client.wait(timeout=60) or server.returncode
            except subprocess.TimeoutExpired:
                failed = True
            finally:
                for p in (server, client):
                    p.kill()
            if failed:
                raise RuntimeError(f"zipccl linkprobe: a peer failed or hung at {rate}, {size} bytes")
            times = [float(t) * 1e3 for t in out.split()]
            q = statistics.quantiles(times, n=4)
            result[size] = [statistics.median(times), q[0], q[2]]
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="400mbit,200mbit")
    parser.add_argument("--sizes", default="340000,493000", help="bytes each host sends")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=25.0)
    parser.add_argument("--peer", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer:
        role, address, size, repeat, gap = args.peer
        print(" ".join(f"{t:.6f}" for t in peer(role, address, int(size), int(repeat), float(gap))))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print("| rate | bytes each way | median ms | p25-p75 | MB/s each way |\n|---|---|---|---|---|")
    for rate in args.rate.split(","):
        for size, (median, p25, p75) in probe(rate, sizes, args.repeat, args.gap_ms).items():
            print(f"| {rate} | {size:,} | {median:.2f} | {p25:.2f}-{p75:.2f} | {size / median / 1e3:.1f} |")


if __name__ == "__main__":
    main()
