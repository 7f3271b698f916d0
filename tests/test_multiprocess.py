"""The collectives across processes started with jax.distributed on 127.0.0.1 (gloo).

Each run is bounded: a hung collective fails the test instead of hanging CI.
"""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("multiprocess_worker.py")
TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("processes,local_devices", [(2, 2), (4, 1)])
def test_every_collective_across_processes(processes, local_devices):
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, str(WORKER), coordinator, str(processes), str(i), str(local_devices)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(processes)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"multi-process collectives did not finish in {TIMEOUT_S} s (hung collective?)")
    finally:
        for p in procs:
            p.kill()
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"ok {i}" in out, f"process {i} failed:\n{out[-3000:]}"
