"""End-to-end benchmark over a real bandwidth-limited network.

    sudo python -m zipccl_jax bench net --procs 2 --rate 1gbit,200mbit --steps 10

Builds a network of namespaces (netns.py: one host per training process, a
bridge, every link shaped to `rate` each way with tbf) and, per rate, starts
one JAX process per namespace with `ip netns exec` (CPU, one device each,
jax.distributed with the coordinator on host 0's address, gloo collectives
over the shaped links). Each process first runs `zipccl_jax.autotune` on the
mesh, with a training step's gradients as its data, as a job would (it
also times zip_psum's plans in situ on them; `--profile PATH` loads that
profile instead), then trains the LM with
lax.psum, zip_psum (the default strategy), zip_psum(compress=False) and
zip_psum(strategy="compressed") (train.measure), reading its own link's
byte counter around the timed gradient syncs. The processes share the
machine's cores (on a small machine the codecs compete, as they would not on
real hosts); `--pin` pins process i to core i mod the core count (worker()
says what that costs).

Every process has a deadline; a hang fails with the processes' last output,
and the namespaces are removed in every case (netns.Network).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import netns, report, train

RESULT_TAG = "NETBENCH-RESULT "
PORT = 23456  # inside the namespaces: no clash with anything outside


def _worker_env() -> dict:
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                        env.get("PYTHONPATH")])))
    return env


def launch(net: netns.Network, spec: dict, cwd: str, timeout: float, module: str = "zipccl_jax.bench.net") -> list[dict]:
    """One process per host running `python -m module worker SPEC` (spec with
    its "process"); their results (the line tagged RESULT_TAG), in host order."""
    procs = []
    for i in range(net.n):
        argv = [sys.executable, "-m", module, "worker", json.dumps({**spec, "process": i})]
        # cwd away from any source checkout: `python -m` puts cwd first on sys.path, and a checkout's
        # zipccl_jax/ has no compiled modules
        procs.append(subprocess.Popen(net.exec(i, argv), env=_worker_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, cwd=cwd))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        tails = "\n".join(f"--- process {i}:\n{(p.communicate()[0] or '')[-1500:]}" for i, p in enumerate(procs))
        raise RuntimeError(f"net benchmark: the processes did not finish in {timeout:.0f} s (hung collective?)\n"
                           + tails) from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for i, (p, out) in enumerate(zip(procs, outputs)):
        lines = [line for line in out.splitlines() if line.startswith(RESULT_TAG)]
        if p.returncode or not lines:
            raise RuntimeError(f"net benchmark: process {i} failed (exit {p.returncode}):\n{out[-3000:]}")
        results.append(json.loads(lines[-1][len(RESULT_TAG):]))
    return results


def preflight(rates: list[str], what: str) -> None:
    """Fails before anything is built: a bad rate (ValueError), or no way to
    build namespaces here (RuntimeError naming `what`)."""
    for rate in rates:
        if rate != "off":
            netns.rate_bits(rate)
    why = netns.unavailable_reason()
    if why:
        raise RuntimeError(f"{what}: {why}")


def _combine(results: list[dict]) -> dict:
    """One result for the run: times of the slowest process (the step ends
    when it does), link bytes averaged over processes, losses and the tuned
    figures of process 0 (every process has the same, checked here)."""
    if any(r["tune"]["profile"] != results[0]["tune"]["profile"] for r in results):
        raise RuntimeError("net benchmark: the processes installed different figures")
    out = {"compute_ms": max(r["compute_ms"] for r in results), "syncs": {},
           "tune": {**results[0]["tune"], "seconds": max(r["tune"]["seconds"] for r in results)}}
    for label in results[0]["syncs"]:
        per = [r["syncs"][label] for r in results]
        if any(not train.losses_identical(p["losses"], per[0]["losses"]) for p in per):
            raise RuntimeError(f"net benchmark: processes disagree on the {label} losses")
        out["syncs"][label] = {**per[0], "step_ms": max(p["step_ms"] for p in per),
                               "comm_ms": max(p["comm_ms"] for p in per),
                               "comm_quartiles_ms": [max(q) for q in zip(*(p["comm_quartiles_ms"] for p in per))],
                               "link_bytes": sum(p["link_bytes"] for p in per) / len(per)}
    return out


def run(procs: int, rates: list[str], cfg, steps: int, warmup: int, repeat: int, timeout: float = 600,
        progress: report.Progress | None = None, profile=None, pin: bool = False) -> list[dict]:
    """The benchmark; returns one combined result (with its rate) per rate.
    Each process autotunes, or with `profile` loads that profile file. `pin`
    pins process i to core i mod the core count (see worker())."""
    preflight(rates, "net benchmark")
    spec = {"procs": procs, "coordinator": f"{netns.SUBNET}.1:{PORT}", "config": dataclasses.asdict(cfg),
            "steps": steps, "warmup": warmup, "repeat": repeat, "profile": profile and str(Path(profile).resolve()), "pin": pin}
    runs = []
    with netns.Network(procs) as net, tempfile.TemporaryDirectory() as cwd:
        for rate in rates:
            if progress:
                progress.start(f"net {procs} processes at {rate}")
            net.set_rate(rate)
            runs.append({"rate": rate, **_combine(launch(net, spec, cwd, timeout))})
            if progress:
                progress.finish()
    return runs


def summary_rows(runs: list[dict]) -> list[dict]:
    rows = []
    for r in runs:
        rows += train.summary_rows(r, rate=r["rate"])
    return rows


def strategy_rows(runs: list[dict]) -> list[dict]:
    """Per rate: what autotune measured (the figures of the link the syncs
    run over: the pmax of the size consensus, a byte transfer's fixed cost and
    rate, XLA's all-reduce's), what the default strategy chose, and its
    communication time against the codec off and against the faster of the
    two forced choices (compress=False, strategy="compressed")."""
    rows = []
    for r in runs:
        syncs, tuned = r["syncs"], r["tune"]
        comm = {label: syncs[label]["comm_ms"] for label in (train.DEFAULT, train.REFERENCE, train.COMPRESSED)}
        link = dict(tuned["profile"]["links"]).get("data") or dict(tuned["profile"]["links"]).get("*") or {}
        rows.append({"rate": r["rate"], "figures": tuned["source"], "consensus us": _us(link, "consensus"),
                     "transfer us + MB/s": f"{_us(link, 'latency')} + {_mb(link, 'bandwidth')}",
                     "all-reduce us + MB/s": f"{_us(link, 'reduce_latency')} + {_mb(link, 'reduce_bandwidth')}",
                     "codec GB/s (size pass)": f"{tuned['profile']['compress_rate'] / 1e9:.2f} / "
                                               f"{tuned['profile']['decompress_rate'] / 1e9:.2f} "
                                               f"({(tuned['profile'].get('size_rate') or 0) / 1e9:.2f})",
                     "bf16 ratio": dict(tuned["profile"]["ratios"]).get("bfloat16", "-"),
                     "tune s": tuned["seconds"], "default plan": train.plan_label(syncs[train.DEFAULT]),
                     # a forced sync that runs the default's very program: their ratio is the bench's noise
                     "same program as": ", ".join(label for label in (train.REFERENCE, train.COMPRESSED) if
                                                  train.plan_label(syncs[label]) == train.plan_label(
                                                      syncs[train.DEFAULT])) or "-",
                     "speedup vs compress=False": comm[train.REFERENCE] / comm[train.DEFAULT],
                     "time / faster forced": comm[train.DEFAULT] / min(comm[train.REFERENCE], comm[train.COMPRESSED])})
    return rows


def in_situ_rows(runs: list[dict]) -> list[dict]:
    """Per rate and bucket: autotune's in-situ time of each zip_psum plan on
    a step's gradients (ms: median per process, the slower process's), which
    the default strategy prefers over the model for that very call."""
    rows = []
    for r in runs:
        for m in r["tune"]["profile"].get("measured") or []:
            rows.append({"rate": r["rate"], "bucket": f"{m['nbytes']:,} B {m['dtype']} over {'/'.join(m['axes'])}",
                         **{name: t * 1e3 for name, t in m["seconds"]},
                         "default plan": train.plan_label(r["syncs"][train.DEFAULT])})
    return rows


def _us(link: dict, figure: str) -> str:
    return "-" if link.get(figure) is None else f"{link[figure] * 1e6:,.0f}"


def _mb(link: dict, figure: str) -> str:
    return "-" if link.get(figure) is None else f"{link[figure] / 1e6:,.4g}"


def plot(path, runs: list[dict], procs: int) -> None:
    groups = [r["rate"] for r in runs]
    series = {label: [r["syncs"][label]["comm_ms"] for r in runs] for label in runs[0]["syncs"]}
    notes = {label: [f"{r['syncs']['lax.psum']['comm_ms'] / r['syncs'][label]['comm_ms']:.2f}x" for r in runs]
             for label in series}
    report.bar_plot(path, f"Gradient sync of the LM, {procs} processes over shaped links (speedup vs lax.psum)",
                    groups, series, "communication ms (median)", notes)


def run_cli(args) -> list[dict]:
    if args.cleanup:
        gone = netns.cleanup(everything=True)
        print(f"removed {len(gone)} namespace(s): {' '.join(gone) or '-'}")
        return []
    cfg = train.config_from_args(args)
    progress = report.Progress(len(args.rate))
    runs = run(args.procs, args.rate, cfg, args.steps, args.warmup, args.repeat, args.timeout, progress, args.profile,
               args.pin)
    print(f"## LM training over a shaped network: {args.procs} processes, one CPU device each; {cfg}\n")
    print("\n".join(f"{r['rate']}: {train.wire_line(r)}" for r in runs) + "\n")
    rows = summary_rows(runs)
    print(report.table(rows))
    print("\nThe default strategy (targets: >= 1.3x faster than compress=False on slow links; at most 1.1x the "
          "faster forced choice at every rate):\n")
    print(report.table(strategy_rows(runs)))
    measured = in_situ_rows(runs)
    if measured:
        print("\nzip_psum's plans timed in situ by autotune (ms; the default takes the fastest):\n")
        print(report.table(measured))
    if args.json:
        report.save_json(args.json, procs=args.procs, config=dataclasses.asdict(cfg), runs=runs)
    if args.plot:
        plot(args.plot, runs, args.procs)
    return rows


# ---------------------------------------------------------------------------
# one training process, inside its namespace


def worker(spec: dict) -> None:
    """Pinned to one core (--pin), a process's gloo thread, which busy-polls
    epoll, and its XLA threads share that core, and a thread waiting for a
    collective often resumes only at the next scheduler tick (4 ms at 250 Hz):
    unshaped syncs then cost about one tick whatever they send. Unpinned (the
    default), the processes share the machine's cores, as their threads would
    share a real host's."""
    i = spec["process"]
    if spec.get("pin") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[i % len(os.sched_getaffinity(0))]})
    import jax

    jax.distributed.initialize(spec["coordinator"], num_processes=spec["procs"], process_id=i,
                               initialization_timeout=60)
    from . import lm

    counter = Path("/sys/class/net/eth0/statistics/tx_bytes")
    mesh = jax.make_mesh((spec["procs"],), ("data",))
    result = train.measure(mesh, lm.Config(**spec["config"]), spec["steps"], spec["warmup"], spec["repeat"],
                           sent_bytes=lambda: int(counter.read_text()), tune=_tuner(mesh, spec["profile"]))
    print(RESULT_TAG + json.dumps(result), flush=True)
    jax.distributed.shutdown()


def _tuner(mesh, profile):
    """tune(grads) for train.measure: autotune with the gradients as data, or
    load the given profile; returns the installed figures and the time taken."""
    from ..autotune import autotune, load

    def tune(grads) -> dict:
        t = time.perf_counter()
        installed = load(profile) if profile else autotune(mesh, data=grads)
        return {"source": f"profile {profile}" if profile else "autotune", "seconds": time.perf_counter() - t,
                "profile": dataclasses.asdict(installed)}
    return tune


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m zipccl_jax.bench.net worker SPEC_JSON (started by `bench net`)")
    worker(json.loads(sys.argv[2]))
