"""The network benchmark: a short real run over shaped namespaces, and its
failure modes. Skipped (with the reason) only where network namespaces
cannot be created: not root, no iproute2, or a kernel that refuses."""

import os
import re

import numpy as np
import pytest

from zipccl_jax.bench import lm, netns
from zipccl_jax.bench import net as netbench
from zipccl_jax.bench import train as trainbench

REASON = netns.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"network benchmark: {REASON}")
TINY = lm.Config(d_model=32, n_layers=1, n_heads=2, seq_len=32, batch_per_device=4)


def ours() -> list[str]:
    """Namespaces and /etc/netns entries made by this test process."""
    mine = f"{netns.PREFIX}-{os.getpid()}-"
    dirs = [d.name for d in netns.NETNS_ETC.glob(mine + "*")]
    return [ns for ns in netns.namespaces() if ns.startswith(mine)] + dirs


@needs_netns
def test_two_processes_over_a_shaped_link():
    runs = netbench.run(2, ["100mbit"], TINY, steps=3, warmup=1, repeat=3, timeout=240)
    assert ours() == [], "namespaces left behind"
    syncs = runs[0]["syncs"]
    default, plain = syncs[trainbench.DEFAULT], syncs[trainbench.REFERENCE]
    forced, lax_ = syncs[trainbench.COMPRESSED], syncs["lax.psum"]
    # each process autotuned: the link it measured is the shaped one, and zip_psum's plans timed in situ on a
    # step's gradients (one bucket), the same on both processes (checked by run()); the default takes the
    # fastest of them, compress=False its variant without the codec
    tuned = runs[0]["tune"]
    assert tuned["source"] == "autotune" and [name for name, _ in tuned["profile"]["links"]] == ["data"]
    # the shaped link, not loopback's GB/s; gloo's all_gather reaches about half the link's rate and is bimodal
    # (bench linkprobe, docs/BENCHMARKS.md): CI measured 0.38 of it once, hence the low floor
    assert 0.2 * 12.5e6 < tuned["profile"]["links"][0][1]["bandwidth"] < 1.2 * 12.5e6, tuned
    (timed,) = tuned["profile"]["measured"]
    assert timed["axes"] == ["data"] and timed["nbytes"] == forced["raw_bytes"]  # the bucket's bytes (n = 2)
    fastest = min(timed["seconds"], key=lambda kv: kv[1])
    plan = trainbench.plan_label(default)
    assert plan == fastest[0] and " measured in situ (autotune) " in default["plans"][0]["reason"], default["plans"]
    assert trainbench.plan_label(plain) == re.sub("^compressed ", "uncompressed ", plan)
    assert trainbench.plan_label(forced).startswith("compressed ")
    assert "('data',) from autotune" in default["plans"][0]["reason"]
    # compression changes no bit of training (nor does the algorithm of a rank-ordered sum), and the run trained
    assert trainbench.losses_identical(default["losses"], plain["losses"])
    assert trainbench.losses_identical(forced["losses"], plain["losses"]) == (plan != "raw all_reduce")
    assert default["losses"][-1] < default["losses"][0]
    # zipccl's count of bytes sent, and what the link counted for the same
    # syncs: plus TCP/IP headers, the ACKs of what it received and the size
    # consensus (pmax)
    ratio = forced["raw_bytes"] / forced["wire_bytes"]
    assert ratio > 1.2
    for s in (default, plain, forced):
        assert s["wire_bytes"] <= s["link_bytes"] < 1.25 * s["wire_bytes"] + 16384, (s["wire_bytes"], s["link_bytes"])
    if plan != "raw all_reduce":  # the uncompressed plans: the raw bits (bf16), XLA's all-reduce: float32
        assert plain["link_bytes"] / forced["link_bytes"] > 0.9 * ratio, (plain["link_bytes"], forced["link_bytes"])
    assert forced["link_bytes"] < lax_["link_bytes"]
    times = {label: (s["step_ms"], s["comm_ms"]) for label, s in syncs.items()}
    # timed apart, a step (compute + sync) can take less than the sync run on its own: CI saw lax.psum's
    # per-leaf all-reduces at 43 ms alone and 21 ms a step on a tiny model, so no order between them
    assert all(comm > 0 and step > 0 for step, comm in times.values()), times
    rows = netbench.summary_rows(runs)
    assert [r["sync"] for r in rows] == list(trainbench.SYNCS)
    assert [r["losses = compress=False"] for r in rows][1:] == [True, True] + [
        "other sum" if plan == "raw all_reduce" else True]
    # the model's time for each sync's plans and autotune's in-situ time of the plan it ran, next to the measured
    predicted = [r["predicted ms"] for r in rows]
    assert predicted[0] == "-" and all(isinstance(t, float) and t > 0 for t in predicted[1:])
    assert predicted[1] == sum(p["predicted_ms"] for p in default["plans"])
    assert [r["in situ ms"] for r in rows] == ["-"] + [dict(timed["seconds"])[trainbench.plan_label(s)] * 1e3
                                                       for s in (default, plain, forced)]
    (row,) = netbench.strategy_rows(runs)
    assert row["default plan"] == plan
    (in_situ,) = netbench.in_situ_rows(runs)
    assert in_situ["default plan"] == plan and in_situ[plan] == fastest[1] * 1e3
    link = tuned["profile"]["links"][0][1]
    assert row["consensus us"] == f"{link['consensus'] * 1e6:,.0f}" and row["transfer us + MB/s"].endswith(
        f" + {link['bandwidth'] / 1e6:,.4g}")
    assert row["speedup vs compress=False"] == plain["comm_ms"] / default["comm_ms"]


@needs_netns
def test_a_hang_fails_with_a_clear_message_and_leaves_nothing():
    with pytest.raises(RuntimeError, match=r"did not finish in 2 s \(hung collective\?\)"):
        netbench.run(2, ["1gbit"], TINY, steps=1, warmup=1, repeat=1, timeout=2)
    assert ours() == []


@needs_netns
def test_network_links_are_shaped_and_torn_down():
    with netns.Network(3) as net:
        net.set_rate("50mbit")
        assert sorted(ours()) == sorted([*net.hosts, net.bridge, *net.hosts])  # namespaces, hosts files
        qdisc = netns._ip("netns", "exec", net.hosts[2], "tc", "qdisc", "show", "dev", "eth0")
        assert "tbf" in qdisc and "50Mbit" in qdisc and "burst 8Kb" in qdisc  # 1 ms of 50 Mbit/s is under 8 KB
        net.set_rate("50mbit", burst_ms=4)  # 25,000 bytes: 4 ms of the rate
        assert "burst 25000b" in netns._ip("netns", "exec", net.hosts[2], "tc", "qdisc", "show", "dev", "eth0")
        with pytest.raises(ValueError, match="burst_ms: expected a positive number of milliseconds, got 0"):
            net.set_rate("50mbit", burst_ms=0)
        route = netns._ip("netns", "exec", net.hosts[0], "ip", "route", "get", net.address(2))
        assert "dev eth0" in route
    assert ours() == []


@needs_netns
def test_the_link_probe_moves_plain_tcp_at_the_shaped_rate_both_ways():
    from zipccl_jax.bench import linkprobe
    result = linkprobe.probe("40mbit", [50_000, 100_000], repeat=8, gap_ms=10)  # 5 MB/s each way
    # the lower quartiles: a loaded machine (CI's 2 cores, the suite beside) only adds time, and a median of
    # few exchanges took it (CI, 2026-12-02: medians 9.7 and 24.6 ms, ratio 2.53; quartiles 9.5 and 21.5)
    (_, small, _), (_, large, _) = result[50_000], result[100_000]
    assert 1.5 < large / small < 2.5, result  # in proportion to the bytes
    assert 3.0 < 100_000 / large / 1e3 < 5.5, result  # MB/s each way, both directions at once
    assert ours() == []


def test_bad_rate_is_rejected_before_anything_is_built():
    with pytest.raises(ValueError, match=r"rate 'fast': expected a number followed by kbit, mbit or gbit"):
        netbench.run(2, ["1gbit", "fast"], TINY, steps=1, warmup=1, repeat=1)
    assert netns.rate_bits("200mbit") == 2e8 and netns.rate_bits("1.5GBIT") == 1.5e9


def test_too_few_hosts_is_an_error():
    with pytest.raises(ValueError, match="hosts: expected 2 to 200, got 1"):
        netns.Network(1)


def test_syncparts_reads_both_processes_on_one_clock():
    from zipccl_jax.bench import syncparts
    # 2 processes, 3 rounds, 4 calls: process 1 starts 2 ms after process 0 and each takes its own time
    starts0 = np.arange(12, dtype=float).reshape(3, 4) * 100e-3
    took0 = np.array([10, 20, 30, 40], float) * 1e-3
    took1 = np.array([[12, 19, 35, 41], [11, 18, 36, 39], [13, 19, 34, 45]], float) * 1e-3
    results = [{"wire_bytes": [600, 900], "starts": starts0.tolist(), "ends": (starts0 + took0).tolist()},
               {"wire_bytes": [600, 900], "starts": (starts0 + 2e-3).tolist(),
                "ends": (starts0 + 2e-3 + took1).tolist()}]
    rows = syncparts.combine(results)
    assert [r["call"] for r in rows] == [*syncparts.PLANS, "all_gather 600 B", "all_gather 900 B"]
    # per call, the slower process's median: process 1's but in the second call (its 19 against 20)
    assert [r["ms"] for r in rows] == pytest.approx([12, 20, 35, 41])
    assert [r["start skew ms"] for r in rows] == pytest.approx([2] * 4)
    # from the later start (process 1's) to the later end: process 0's 20 ends at 20, process 1's 19 at 21
    assert [r["later start to later end ms"] for r in rows] == pytest.approx([12, 19, 35, 41])
    results[1]["wire_bytes"] = [600, 901]
    with pytest.raises(RuntimeError, match="the processes sent different byte counts"):
        syncparts.combine(results)


@needs_netns
def test_syncparts_times_the_sync_and_its_transfer():
    import jax
    from zipccl_jax.bench import syncparts
    (rows,) = syncparts.run(["100mbit"], TINY, repeat=3, timeout=240).values()
    assert ours() == []
    raw = 2 * sum(leaf.size for leaf in jax.tree.leaves(lm.init_params(jax.random.key(0), TINY)))
    compressed, uncompressed = (int(r["call"].split()[1].replace(",", "")) for r in rows[2:])
    assert uncompressed == raw + 16 and raw / compressed > 1.2, (raw, compressed, uncompressed)  # one stream
    # the processes start within a few ms of each other, and the raw bytes' all_gather takes at least their time
    # at the shaped rate (12.5 MB/s; tbf's bucket, 12.5 KB, leaves at once)
    assert all(r["start skew ms"] < 20 for r in rows), rows
    assert rows[3]["ms"] > (uncompressed - 12_500) / 12.5e6 * 1e3, rows
