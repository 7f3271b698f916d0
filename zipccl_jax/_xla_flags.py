"""XLA:GPU's latency-hiding scheduler, turned on at import for the compressed collectives.

On GPUs each compressed collective sends its bulk by a static-size collective and what overflowed
by one `ragged_all_to_all` (docs/DESIGN.md, "Static transfers on GPUs"). XLA:GPU runs its
latency-hiding scheduler by default only on a module whose collectives its speed-of-light cost
model knows, and ragged_all_to_all is not one (docs/GPU.md, "The compiled program"): without the
scheduler no transfer of the program, ours or lax's, overlaps compute. A lowering cannot set a
compile option, so at import the library adds `--xla_gpu_enable_latency_hiding_scheduler=true` to
`XLA_FLAGS`, which XLA reads once, when JAX's backends start. It leaves XLA_FLAGS alone where:

- `ZIPCCL_XLA_FLAGS=0` is set (then jit the steps with `compiler_options=GPU_COMPILER_OPTIONS`);
- XLA_FLAGS already names the flag (the user's choice, either way);
- JAX's backends already started, so the flag would be read by nothing: then, if a GPU backend
  is among them, a warning says how to get the scheduler.

`STATE` says which of these happened: "set", "off", "user" or "late".
"""

import os
import warnings

FLAG = "xla_gpu_enable_latency_hiding_scheduler"
OPT_OUT = "ZIPCCL_XLA_FLAGS"

# For a jit of a step that uses the compressed collectives on GPUs where the import did not set the
# flag: jax.jit(step, compiler_options=GPU_COMPILER_OPTIONS).
GPU_COMPILER_OPTIONS = {FLAG: True}


def _backends_started() -> tuple[bool, bool]:
    """(whether JAX's backends have started, whether one of them is a GPU's), starting nothing."""
    from jax._src import xla_bridge
    started = getattr(xla_bridge, "backends_are_initialized", None)
    if started is None or not started():
        return False, False
    return True, any(name in ("cuda", "rocm", "gpu") for name in xla_bridge.backends())


def apply() -> str:
    """Adds the flag to XLA_FLAGS where it can still take effect; returns the resulting STATE."""
    if os.environ.get(OPT_OUT, "1").strip().lower() in ("0", "false", "no", "off"):
        return "off"
    flags = os.environ.get("XLA_FLAGS", "")
    if FLAG in flags:
        return "user"
    started, gpu = _backends_started()
    if started:
        if gpu:
            warnings.warn(
                "zipccl_jax was imported after JAX's backends started, so it could not turn on XLA:GPU's "
                f"latency-hiding scheduler (XLA_FLAGS=--{FLAG}=true): without it no collective of a step that "
                "uses the compressed collectives overlaps compute. Import zipccl_jax before running JAX code, "
                "set that flag in XLA_FLAGS, or jit the step with compiler_options=zipccl_jax.GPU_COMPILER_OPTIONS "
                f"(and set {OPT_OUT}=0 to silence this).", RuntimeWarning, stacklevel=3)
        return "late"
    os.environ["XLA_FLAGS"] = f"{flags} --{FLAG}=true".strip()
    return "set"


def describe(state: str | None = None) -> str:
    """What STATE (or state) means, in a line: for the selftest and bench schedule."""
    return {"set": f"on (zipccl_jax's import set --{FLAG}=true in XLA_FLAGS)",
            "off": f"XLA's default ({OPT_OUT}=0; jit steps with compiler_options=GPU_COMPILER_OPTIONS)",
            "user": "as XLA_FLAGS set it",
            "late": "XLA's default (zipccl_jax was imported after JAX's backends started; "
                    "jit steps with compiler_options=GPU_COMPILER_OPTIONS)"}[state or STATE]


STATE = apply()
