"""One process of a multi-process autotune (gloo on CPU).

    python autotune_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID PROFILE_PATH

Each process has 2 devices; the mesh is ("hosts", "local"), "hosts" across
processes. Every process measures, then its figures are replaced by given
ones skewed by its process id (so they differ for certain, each link figure
slower on one process or the other), and so are the times of zip_psum's plans
timed in situ on the data (after the real timing ran: the programs of both
processes must match), each process preferring another plan; then autotune
agrees on them. Prints JSON lines: LOCAL (this process's figures), IN_SITU
(this process's medians per plan, per timed call), INSTALLED (the agreed
profile), PLANS (decisions and figures), RELOADED (the same plans after a
restart from the saved profile), and FILE_IGNORED (the source a plan names
with nothing installed and a profile file at $ZIPCCL_PROFILE: multi-process
jobs ignore it).
"""

import dataclasses
import importlib
import json
import os
import sys

coordinator, num_processes, process_id, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                           initialization_timeout=60)

import zipccl_jax as zc  # noqa: E402
from zipccl_jax import profile, strategy  # noqa: E402

tuning = importlib.import_module("zipccl_jax.autotune")  # the module (zc.autotune is the function)
from zipccl_jax import insitu  # noqa: E402
devices = np.array(jax.devices()).reshape(num_processes, 2)
assert [{d.process_index for d in row} for row in devices] == [{i} for i in range(num_processes)]
mesh = Mesh(devices, ("hosts", "local"))
measure = tuning._measure


def skewed(*args):
    local = measure(*args)
    k = 1 + process_id
    # link figures measured by each process on its own differ by chance: these are given, on process 1
    # some slower and some faster than on process 0 (the measurement still ran, with its agreed loops)
    base = {"latency": 3e-4, "bandwidth": 1e9, "consensus": 1e-4, "reduce_latency": 2e-3, "reduce_bandwidth": 8e8}
    skew = {"latency": k, "bandwidth": 1 / k, "consensus": 1 / k, "reduce_latency": k, "reduce_bandwidth": k}
    links = tuple((name, profile.Link(link.size, **{f: base[f] * skew[f] for f in base})) for name, link in local.links)
    local = dataclasses.replace(local, compress_rate=local.compress_rate * k, decompress_rate=local.decompress_rate / k,
                                links=links)
    print("LOCAL " + json.dumps(dataclasses.asdict(local)), flush=True)
    return local


# per plan (strategy.plan_names order) in ms: process 0 alone would pick the
# uncompressed reduce-scatter, process 1 XLA's all-reduce; the slower of each
# (agreed) makes the uncompressed all-gather fastest
IN_SITU_MS = [[5, 1, 3, 4, 2], [1, 5, 3, 2, 4]][process_id]
time_plans = insitu._time_plans
timed = []


def skewed_times(*args):
    time_plans(*args)  # the real collectives run (and would hang if the processes' programs differed)
    timed.append([t / 1e3 * (1 + len(timed)) for t in IN_SITU_MS])
    return np.array(timed[-1])


def plans():
    calls = [("psum", 1 << 20, "bfloat16", ("hosts",), 2), ("psum", 64 << 20, "bfloat16", ("hosts", "local"), 4),
             ("all_gather", 4 << 20, "float32", ("local",), 2), ("all_to_all", 1 << 16, "bfloat16", ("hosts",), 2),
             ("psum", 1 << 17, "bfloat16", ("hosts",), 2), ("psum", 1 << 17, "bfloat16", ("local",), 2)]
    return [dataclasses.asdict(strategy.plan(*call)) | {"name": strategy.plan(*call).name} for call in calls]


tuning._measure = skewed
insitu._time_plans = skewed_times
data = {"w": np.random.default_rng(process_id).standard_normal(1 << 16, np.float32).astype(jax.numpy.bfloat16)}
installed = zc.autotune(mesh, data=data, path=path, link_bytes=1 << 20, codec_bytes=1 << 20)
print("IN_SITU " + json.dumps(timed), flush=True)
print("INSTALLED " + json.dumps(dataclasses.asdict(installed)), flush=True)
print("PLANS " + json.dumps(plans()), flush=True)

strategy.uninstall()
own_file = f"{path}.process{process_id}"
profile.write(dataclasses.replace(installed, links=(("*", profile.Link(4, 1.0, 1.0)),)), own_file)
os.environ[strategy.PROFILE_ENV] = own_file
print("FILE_IGNORED " + json.dumps(strategy.model_for(("hosts",)).source), flush=True)

tuning._measure = None  # a restart loads the profile: nothing is measured
zc.autotune(mesh, path=path)
print("RELOADED " + json.dumps(plans()), flush=True)
jax.distributed.shutdown()
