"""Counts what the CUDA kernels execute per element, in the host emulation (docs/GPU.md's model).

    python tests/cuda_counts.py [ELEMENTS]

Builds tests/cuda_emulation.cc (no sanitizers), compresses and decompresses ELEMENTS (default 2^18)
Gaussian values of each dtype in one stream, and prints per kernel and dtype the warp intrinsics,
__syncthreads and atomics its threads executed per element (each thread's own count, as a GPU issues
them), with the launch shape. An emulator's count, not a GPU measurement.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cuda_emulation import build, compress_request, decompress_request, run_emulator  # noqa: E402

from zipccl_jax import reference as ref  # noqa: E402  (the streams the handlers read: version 6)


def main(n: int) -> None:
    os.environ["ZIPCCL_EMU_COUNTS"] = "1"
    exe = build(Path(tempfile.mkdtemp()), "undefined")
    print(f"{'dtype':9} {'kernel':25} {'threads/elem':>12} {'warp ops/elem':>13} {'syncthreads/elem':>16} "
          f"{'atomics/elem':>12}")
    for dtype in (ml_dtypes.bfloat16, np.float16, np.float32):
        x = np.random.default_rng(0).standard_normal(n).astype(dtype)
        stream = ref.compress(x)
        run = run_emulator(exe, [compress_request(x[None]), decompress_request([stream], dtype, n)], (132, 2))
        assert run.returncode == 0, run.stderr.decode()[-2000:]
        for line in run.stderr.decode().splitlines():
            name, _, threads, warp_ops, barriers, atomics = line.split()
            print(f"{np.dtype(dtype).name:9} {name:25} {int(threads) / n:12.4f} {int(warp_ops) / n:13.4f} "
                  f"{int(barriers) / n:16.4f} {int(atomics) / n:12.4f}")


if __name__ == "__main__":
    main(int(float(sys.argv[1])) if len(sys.argv) > 1 else 1 << 18)
