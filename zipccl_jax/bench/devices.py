"""Which devices a tool or an example runs its mesh on, and saying so.

A program that exchanges data needs several devices. On a host with one GPU
the default platform has one, so `jax.devices()` alone would give a mesh
on which nothing crosses a link (and wire ratios of 0 / 0): the programs
take the default platform's devices when it has enough, else the CPU's
(the virtual devices that XLA_FLAGS=--xla_force_host_platform_device_count
makes, which the examples and the CLI ask for before JAX starts), and print
where they ran and why.
"""

from __future__ import annotations

import os

VIRTUAL_CPU_FLAG = "--xla_force_host_platform_device_count"


def ask_for_virtual_cpus(count: int = 8) -> None:
    """Asks for `count` virtual CPU devices unless XLA_FLAGS already sets a
    count; must run before JAX starts its CPU backend (harmless on GPU hosts:
    it affects the CPU platform only)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if VIRTUAL_CPU_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {VIRTUAL_CPU_FLAG}={count}".strip()


def describe(devices) -> str:
    return f"{len(devices)} x {devices[0].platform}"


def choose(want: int | None = None, *, need: int = 2, platform: str | None = None) -> tuple[list, str]:
    """(devices, note): the first `want` (all, if None) devices of `platform`,
    by default of the default platform if it has at least `need`, else of the
    CPU if it has; `note` says why the CPU was taken ("" if it was not).
    Raises SystemExit naming what is missing when no platform asked for
    has `need` devices."""
    import jax

    if platform is not None:
        devices = jax.devices(platform)
        if len(devices) < need:
            raise SystemExit(f"zipccl_jax: this needs {need} devices; JAX sees {describe(devices)}"
                             + _hint(platform))
        return devices[:want], ""
    default = jax.devices()
    if len(default) >= need:
        return default[:want], ""
    cpus = jax.devices("cpu")
    if len(cpus) >= need:
        chosen = cpus[:want]
        return chosen, (f"the default platform, {default[0].platform}, has {_count(len(default))}, fewer than the "
                        f"{need} this needs: running on {len(chosen)} virtual CPU devices")
    raise SystemExit(f"zipccl_jax: this needs {need} devices; JAX sees {describe(default)}"
                     + ("" if cpus == default else f" and {describe(cpus)}") + _hint("cpu"))


def _count(n: int) -> str:
    return f"{n} device" + ("" if n == 1 else "s")


def _hint(platform: str) -> str:
    if platform != "cpu":
        return ""
    return (f". For virtual CPU devices set XLA_FLAGS={VIRTUAL_CPU_FLAG}=8 before JAX starts "
            "(the examples and `python -m zipccl_jax` do when it is unset)")


def wire_ratio(raw_bytes: float, wire_bytes: float) -> str:
    """'1.508x fewer' -- or, when nothing was sent (a one-device mesh), says so."""
    if wire_bytes <= 0:
        return "nothing crossed a link (one device)" if raw_bytes <= 0 else "no bytes sent"
    return f"{raw_bytes / wire_bytes:.3f}x fewer"
