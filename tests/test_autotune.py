"""autotune: measuring each mesh axis and the codec, installing the figures,
profiles that reload to the same plans, and agreement across processes."""

import dataclasses
import functools
import importlib
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zipccl_jax as zc
from zipccl_jax import __main__ as cli
from zipccl_jax import profile, strategy

from conftest import cpu_devices
from test_multiprocess import free_port

# These tests are about the CPU's defaults and figures (profiles measured on the CPU devices the
# suite runs on), so they name the platform: by default it is the default platform, a GPU's on a
# GPU host (test_strategy.py's test_platform_defaults_are_what_an_untuned_process_uses covers it).
plan = functools.partial(strategy.plan, platform="cpu")
model_for = functools.partial(strategy.model_for, platform="cpu")

tuning = importlib.import_module("zipccl_jax.autotune")  # the module (zc.autotune is the function)
WORKER = Path(__file__).with_name("autotune_worker.py")
TIMEOUT_S = 240
SMALL = dict(link_bytes=1 << 20, codec_bytes=1 << 20)
CALLS = [("psum", 16 << 20, jnp.bfloat16, ("data",), 4), ("all_to_all", 1 << 20, jnp.float32, ("model",), 2),
         ("psum", 4 << 20, jnp.float16, ("data", "model"), 8)]
IN_SITU_CALLS = [("psum", 1 << 17, jnp.bfloat16, ("data",), 4), ("psum", 1 << 17, jnp.bfloat16, ("model",), 2)]


FIGURES = ("compress", "algorithm", "latency", "link_bandwidth", "consensus_latency", "reduce_latency",
           "reduce_bandwidth", "compress_rate", "decompress_rate", "ratio", "modelled", "measured")


def decisions(plans):
    """What a plan decides and the figures behind it (not where they were read from)."""
    return [tuple(getattr(p, k) for k in FIGURES) for p in plans]


def test_autotune_measures_each_axis_and_a_restart_reloads_the_same_plans(tmp_path, monkeypatch):
    mesh = jax.make_mesh((4, 2), ("data", "model"), devices=cpu_devices())
    gaussian = np.random.default_rng(0).standard_normal(1 << 16, np.float32)
    data = {"w": gaussian.astype(jnp.bfloat16), "b": gaussian, "step": np.arange(8)}
    path = tmp_path / "profile.json"
    prof = zc.autotune(mesh, data=data, path=path, **SMALL)
    links = dict(prof.links)
    assert {name: link.size for name, link in links.items()} == {"data": 4, "model": 2}
    for name, link in links.items():  # each figure on its own, so a failure names it
        for figure, low, high in (("latency", 0, 0.5), ("bandwidth", 1e6, 1e12), ("consensus", 1e-9, 0.5),
                                  ("reduce_latency", 0, 0.5), ("reduce_bandwidth", 1e6, 1e12)):
            assert low <= getattr(link, figure) < high, (name, figure, getattr(link, figure))
    assert prof.platform == "cpu" and 1e6 < prof.compress_rate < 1e11 and 1e6 < prof.decompress_rate < 1e11
    ratios = dict(prof.ratios)  # the worst of 8 streams: a little under the whole array's 1.518 / 1.206
    assert ratios.keys() == {"bfloat16", "float32"} and 1.45 < ratios["bfloat16"] < 1.52 and 1.15 < ratios[
        "float32"] < 1.21
    assert 1e6 < prof.size_rate < 1e11 and 1e6 < prof.copy_rate < 1e12
    # zip_psum's plans timed in situ on data's two buckets (the int leaf is not compressed), over each axis
    assert [(m.axes, m.axis_size, m.dtype, m.nbytes) for m in prof.measured] == [
        (("data",), 4, "float32", 1 << 18), (("data",), 4, "bfloat16", 1 << 17),
        (("model",), 2, "float32", 1 << 18), (("model",), 2, "bfloat16", 1 << 17)]
    assert all([name for name, _ in m.seconds] == list(strategy.plan_names("psum")) and all(
        0 < t < 5 for _, t in m.seconds) for m in prof.measured), prof.measured
    assert profile.read(path) == prof
    first = [plan(*call) for call in CALLS + IN_SITU_CALLS]
    assert [(p.source, p.axes) for p in first[:3]] == [("autotune", ("data",)), ("autotune", ("model",)),
                                                       ("autotune", ("data", "model"))]
    assert first[0].link_bandwidth == links["data"].bandwidth and first[0].ratio == ratios["bfloat16"]
    assert first[2].latency == max(link.latency for link in links.values())
    assert [p.measured for p in first[:3]] == [(), (), ()]
    for p, m in zip(first[3:], prof.measured[1::2]):  # the bf16 calls: the fastest plan as measured
        assert p.measured == m.seconds and p.measured_seconds == min(t for _, t in m.seconds)

    strategy.uninstall()
    monkeypatch.setattr(tuning, "_measure", None)  # a restart measures nothing
    assert zc.autotune(mesh, data=data, path=path) == prof
    again = [plan(*call) for call in CALLS + IN_SITU_CALLS]
    assert decisions(again) == decisions(first) and again[0].source == f"profile {path}"
    # data whose buckets the profile did not time: measured again
    measured = dataclasses.replace(prof, measured=())
    monkeypatch.setattr(tuning, "_measure", lambda *args: measured)
    stub = lambda mesh, leaves, *args: (profile.Measured("psum", ("data",), 4, "bfloat16", leaves[0][1] * 2,  # noqa: E731
                                                         (("raw all_reduce", 1.0),)),)
    monkeypatch.setattr(tuning.insitu, "measure", stub)
    again = zc.autotune(mesh, data={"w": data["w"][:4096]}, path=path)
    assert again.measured == stub(None, [(None, 4096)]) and profile.read(path) == again


def test_a_profile_for_another_mesh_is_measured_again(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    other = profile.Profile("cpu", "cpu", 1e9, 1e9, (), (("data", profile.Link(4, 1e-4, 1e9)),))
    profile.write(other, path)
    measured = dataclasses.replace(other, links=(("data", profile.Link(8, 2e-4, 5e8)),))
    monkeypatch.setattr(tuning, "_measure", lambda *args: measured)
    mesh = jax.make_mesh((8,), ("data",), devices=cpu_devices())
    assert zc.autotune(mesh, path=path) == measured and profile.read(path) == measured
    assert model_for(("data",)).link_bandwidth == 5e8
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"profile .*profile.json is unreadable on process\(es\) \[0\]: .*"
                                         "not a zipccl_jax profile"):
        zc.autotune(mesh, path=path)


def test_a_profile_of_an_older_version_is_measured_again_or_refused_by_load(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    path.write_text('{"zipccl_jax_profile": 2, "platform": "cpu", "device_kind": "cpu", "codec": {"compress_rate": '
                    '1e9, "decompress_rate": 1e9}, "ratios": {}, "links": {"data": {"size": 8, "latency": 0.004, '
                    '"bandwidth": 1e9}}}')
    with pytest.raises(profile.OutdatedProfile, match=r"version 2, written by an older zipccl_jax .*calibrate"):
        tuning.load(path)
    measured = profile.Profile("cpu", "cpu", 1e9, 1e9, (), (("data", profile.Link(8, 2e-4, 5e8, 1e-4, 3e-3, 4e8)),))
    monkeypatch.setattr(tuning, "_measure", lambda *args: measured)
    mesh = jax.make_mesh((8,), ("data",), devices=cpu_devices())
    with pytest.warns(UserWarning, match=r"version 2, .*; measuring again"):
        assert zc.autotune(mesh, path=path) == measured
    assert profile.read(path) == measured and model_for(("data",)).reduce_latency == 3e-3


def test_fit_is_the_line_through_two_points_and_never_negative():
    assert tuning.fit((1000, 2e-3), (11000, 3e-3)) == pytest.approx((1.9e-3, 1e7))
    # noise: the larger probe no slower than the smaller (XLA:CPU's all-reduce over
    # gloo on one pinned core costs a 4 ms scheduler tick at any size)
    assert tuning.fit((1000, 4e-3), (11000, 4e-3)) == pytest.approx((4e-3 - 1000 * 4e-4 / 10000, 10000 / 4e-4))
    assert tuning.fit((1000, 1e-3), (2000, 10e-3)) == (0.0, pytest.approx(1000 / 9e-3))


def test_a_codec_rate_is_the_fastest_run_of_a_span_not_of_three(monkeypatch):
    now, calls = [0.0], []
    monkeypatch.setattr(tuning.time, "perf_counter", lambda: now[0])

    def op_taking(durations):
        durations = iter(durations)

        def op():
            calls.append(next(durations))
            now[0] += calls[-1]
        return op
    # the untimed run and three more are slow (a burst of other work on the core), then the op's own 1 ms
    assert tuning._fastest_seconds(op_taking([0.004] * 4 + [0.001] * 100), span=0.02) == pytest.approx(0.001)
    assert len(calls) == 1 + 3 + 8  # then runs until 20 ms are timed: 12 + 8 * 1
    calls.clear()
    assert tuning._fastest_seconds(op_taking([0.001] * 100), span=0.02, most=5) == pytest.approx(0.001)
    assert len(calls) == 1 + 5  # at most `most` timed runs
    calls.clear()
    assert tuning._fastest_seconds(op_taking([0.5] * 10), span=0.02) == 0.5 and len(calls) == 1 + tuning.REPEAT


def test_load_installs_a_profile_as_it_is(tmp_path):
    """load() takes a profile of the job's platform (the default device's: the CPU here, a GPU on a
    GPU host) as it is, and refuses one of another platform, naming both."""
    here = strategy.platform_family(jax.devices()[0].platform)
    other = "gpu" if here == "cpu" else "cpu"
    path = tmp_path / "given.json"
    profile.write(profile.Profile(here, "any", 1e9, 2e9, (), (("*", profile.Link(2, 1e-3, 25e6)),)), path)
    assert tuning.load(path).links[0][1].bandwidth == 25e6
    p = strategy.plan("psum", 16 << 20, jnp.bfloat16, ("data",), 2, platform=here)
    assert p.compress and p.source == f"profile {path}" and p.link_bandwidth == 25e6
    with pytest.raises(ValueError, match="no profile at"):
        tuning.load(tmp_path / "missing.json")
    profile.write(profile.Profile(other, "H100", 1e9, 2e9, (), ()), path)
    with pytest.raises(ValueError, match=f"is for platform {other}, this job runs on {here}"):
        tuning.load(path)


def test_calibrate_is_autotune_over_all_local_devices(tmp_path, capsys):
    out = tmp_path / "calibrated.json"
    cli.main(["calibrate", "--output", str(out), "--platform", "cpu"])
    prof = profile.read(out)
    assert prof.platform == "cpu" and [(name, link.size) for name, link in prof.links] == [("*", 8)]
    printed = capsys.readouterr().out
    assert f"profile written to {out}" in printed
    link = prof.links[0][1]
    assert f"axis *: 8 devices, consensus (tiny pmax) {link.consensus * 1e6:.0f} us, byte " \
           f"transfer {link.latency * 1e6:.0f} us + {link.bandwidth / 1e6:.4g} MB/s received, XLA all-reduce " \
           f"{link.reduce_latency * 1e6:.0f} us + {link.reduce_bandwidth / 1e6:.4g} MB/s sent" in printed
    assert model_for(("any axis",), platform="cpu").link_bandwidth == prof.links[0][1].bandwidth  # every axis


def test_two_processes_with_different_figures_install_the_same_and_plan_the_same(tmp_path):
    path = tmp_path / "profile.json"
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, str(WORKER), coordinator, "2", str(i), str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"multi-process autotune did not finish in {TIMEOUT_S} s")
    finally:
        for p in procs:
            p.kill()
    lines = []
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} failed:\n{out[-3000:]}"
        lines.append({line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                      if line.split(" ", 1)[0] in ("LOCAL", "IN_SITU", "INSTALLED", "PLANS", "RELOADED",
                                                   "FILE_IGNORED")})
    local = [out["LOCAL"] for out in lines]
    assert local[0]["compress_rate"] != local[1]["compress_rate"]
    installed = lines[0]["INSTALLED"]
    assert lines[1]["INSTALLED"] == installed
    assert installed["compress_rate"] == min(loc["compress_rate"] for loc in local)
    assert installed["decompress_rate"] == min(loc["decompress_rate"] for loc in local)
    for i, (name, link) in enumerate(installed["links"]):
        assert name == ["hosts", "local"][i] and link["size"] == 2
        for figure in profile.LINK_FIGURES:  # each the slowest of the two processes'
            slowest = min if figure.endswith("bandwidth") else max
            assert link[figure] == slowest(loc["links"][i][1][figure] for loc in local), figure
        assert {figure: link[figure] == local[0]["links"][i][1][figure] for figure in profile.LINK_FIGURES} == {
            "latency": False, "bandwidth": False, "consensus": True, "reduce_latency": False,
            "reduce_bandwidth": True}
    assert installed["ratios"][0][1] == min(loc["ratios"][0][1] for loc in local)
    # the plans timed in situ (one bucket of 128 KiB bf16, over each axis): each time the slower process's
    assert [(m["axes"], m["nbytes"], m["dtype"]) for m in installed["measured"]] == [
        (["hosts"], 1 << 17, "bfloat16"), (["local"], 1 << 17, "bfloat16")]
    for i, m in enumerate(installed["measured"]):
        assert [name for name, _ in m["seconds"]] == list(strategy.plan_names("psum"))
        assert [t for _, t in m["seconds"]] == [max(a, b) for a, b in zip(*(out["IN_SITU"][i] for out in lines))]
    assert lines[0]["PLANS"] == lines[1]["PLANS"]
    assert [p["source"] for p in lines[0]["PLANS"]] == ["autotune"] * 6
    # the calls timed in situ take the plan the agreed times make fastest, which neither process alone would
    assert [p["name"] for p in lines[0]["PLANS"][4:]] == ["uncompressed all_gather+local_reduce"] * 2
    assert all(" measured in situ (autotune) " in p["reason"] for p in lines[0]["PLANS"][4:])
    for out in lines:
        assert [{k: p[k] for k in FIGURES} for p in out["RELOADED"]] == [{k: p[k] for k in FIGURES} for p in out["PLANS"]]
        assert out["FILE_IGNORED"] == strategy.PLATFORM_DEFAULTS["cpu"].source


def test_data_whose_buckets_differ_between_processes_is_refused_before_anything_runs(monkeypatch):
    mesh = jax.make_mesh((8,), ("data",), devices=cpu_devices())
    other_process = lambda v: np.stack([np.asarray(v, np.float64), np.asarray(v, np.float64) + 1])  # noqa: E731
    monkeypatch.setattr(tuning, "_gather", other_process)
    monkeypatch.setattr(tuning, "_measure", None)
    with pytest.raises(ValueError, match=r"autotune's data must have the same float leaves \(dtypes and sizes per "
                                         r"device\) on every process .*the processes' data differ"):
        zc.autotune(mesh, data={"w": np.zeros(64, np.float32)})
