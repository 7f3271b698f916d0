"""One process of a multi-process job that runs compressed collectives in a loop
until a peer dies (test_failure.py kills one mid-run).

    python failure_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID TIMEOUT_S HEARTBEAT_S [STALL_AT]

TIMEOUT_S sets XLA:CPU's collective timeout (how long a collective waits for
a peer) and HEARTBEAT_S jax.distributed's heartbeat timeout (how long until a
peer that stopped answering is declared dead); docs/RELIABILITY.md explains
both. With STALL_AT the process stops calling collectives at that step (alive,
still heartbeating) instead of running on. Prints "step K" after each step and,
when a step fails, "error after S s: <exception>" and exits 3.
"""

import os
import sys
import time

coordinator, num_processes, process_id, timeout_s = sys.argv[1], *map(int, sys.argv[2:5])
heartbeat_s = int(sys.argv[5])
stall_at = int(sys.argv[6]) if len(sys.argv) > 6 else -1
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=2 --xla_cpu_collective_timeout_seconds={timeout_s}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                           initialization_timeout=60, heartbeat_timeout_seconds=heartbeat_s)

import zipccl_jax as zc  # noqa: E402
from zipccl_jax.bench.data import gaussian  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("d",))
x = np.stack([gaussian(200_000, "bfloat16", seed=i) for i in range(jax.device_count())])
xs = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("d")), lambda idx: x[idx])
step_fn = jax.jit(jax.shard_map(lambda a: zc.zip_psum(a[0], "d", strategy="compressed")[None], mesh=mesh,
                                in_specs=P("d"), out_specs=P("d")))
for step in range(100_000):
    if step == stall_at:
        print("stalling", flush=True)
        time.sleep(3600)
    start = time.monotonic()
    try:
        jax.block_until_ready(step_fn(xs))
    except Exception as err:  # noqa: BLE001 (any failure of the step is the point)
        print(f"error after {time.monotonic() - start:.1f} s: {type(err).__name__}: {str(err)[:300]}", flush=True)
        os._exit(3)  # a clean shutdown would wait for the dead peer
    print(f"step {step}", flush=True)
