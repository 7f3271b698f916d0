"""Command line: python -m zipccl_jax {selftest, bench codec|collectives|train|net|wire|gpu|schedule|static-codes, calibrate} [options]."""

import argparse


def _ints(s: str) -> list[int]:
    return [int(float(v)) for v in s.split(",")]


def _list(s: str) -> list[str]:
    return [v.strip() for v in s.split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zipccl_jax")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="benchmarks: progress on stderr, a summary table on stdout")
    b.add_argument("what", choices=["codec", "collectives", "train", "net", "wire", "gpu", "schedule", "static-codes"],
                   help="codec: ratios and single-core speeds vs baselines; collectives: wire bytes and time vs "
                        "lax; train: LM step and sync time, lax.psum vs zip_psum, on the local devices; net: the "
                        "same over a shaped network of namespaces, one process per host (root); wire: wire bytes "
                        "against the codec's on real traffic, today's transfer and alternatives; gpu: the CUDA "
                        "codec, a psum bucket's row ops and other GPU codecs with CUDA events, and the modelled psum "
                        "they give; schedule: a training step compiled for N x H100 without a GPU (jax's CUDA plugin), "
                        "its collectives, what overlaps them and the host round trips, ours beside lax's; static-codes: "
                        "a study (issue 26) of exponent codes fixed ahead of time against format version 5's ratios")
    b.add_argument("--repeat", type=int, default=7, help="timed runs per measurement (median)")
    b.add_argument("--json", default=None, metavar="OUT.json",
                   help="also write the results as JSON (schedule: '-' writes them to stdout instead of tables)")
    b.add_argument("--plot", default=None, metavar="OUT.png", help="also draw the results (needs matplotlib)")
    g = b.add_argument_group("codec")
    g.add_argument("--elements", type=int, default=1 << 24, help="Gaussian values per dtype")
    g.add_argument("--core", type=int, default=None, help="pin to this CPU core")
    g.add_argument("--lm-steps", type=int, default=200, help="training steps of the LM whose traffic is measured")
    g.add_argument("--against", default=None, metavar="MODULE.so",
                   help="this build's C++ codec side by side with another build's _zipccl_cpu module instead "
                        "(e.g. format version 5's, built from its commit; speeds, ratios); static-codes: "
                        "version 5's module, which it compares with")
    g.add_argument("--rounds", type=int, default=3, help="--against: rounds alternating which build runs first")
    b.add_argument("--platform", choices=["cpu", "gpu"], default=None,
                   help="collectives and train: run on this platform's devices (default: the default platform's, "
                        "or the virtual CPU devices where it has fewer than two)")
    g = b.add_argument_group("collectives")
    g.add_argument("--sizes", type=_ints, default=[4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20],
                   help="bytes per device, comma-separated")
    g.add_argument("--data", choices=["gaussian", "minilm"], default="gaussian")
    g.add_argument("--collectives", type=_list, default=None,
                   help="comma-separated subset of psum,all_gather,psum_scatter,all_to_all,ppermute")
    g = b.add_argument_group("train, net and wire (model defaults: zipccl_jax.bench.lm.Config)")
    g.add_argument("--steps", type=int, default=10, help="timed training steps per sync")
    g.add_argument("--warmup", type=int, default=2, help="untimed first steps (compilation)")
    for name in ("d_model", "n_layers", "n_heads", "seq_len", "batch_per_device"):
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None)
    g = b.add_argument_group("net")
    g.add_argument("--procs", type=int, default=2, help="training processes, one namespace each")
    g.add_argument("--rate", type=_list, default=["1gbit", "200mbit"],
                   help="link rates each way, comma-separated (kbit/mbit/gbit; 'off': unshaped)")
    g.add_argument("--timeout", type=float, default=900, help="seconds each run of the processes may take")
    g.add_argument("--cleanup", action="store_true", help="only remove namespaces left by killed runs")
    g.add_argument("--pin", action="store_true",
                   help="pin process i to core i mod the cores (its network thread then waits for scheduler ticks)")
    g.add_argument("--profile", default=None, metavar="PATH.json",
                   help="every process loads this profile instead of running autotune")
    g = b.add_argument_group("wire")
    g.add_argument("--captures", type=_ints, default=[1, 10, 30], help="LM steps whose gradients are taken")
    g.add_argument("--examples", default="examples", help="the directory of moe.py and fsdp.py")
    g.add_argument("--rungs", type=_ints, default=[16, 32], help="ladder sizes shown per family")
    g = b.add_argument_group("gpu")
    g.add_argument("--gpu-elements", type=_ints, default=None,
                   help="elements per dtype, comma-separated (default 1M,4M,16M,64M,256M)")
    g.add_argument("--buckets", type=_ints, default=[16 << 20, 64 << 20],
                   help="psum bucket sizes in bytes of bfloat16, comma-separated, cut into 8 and 64 rows")
    g.add_argument("--df11-data", default=None, metavar="DATA.npz",
                   help="data encoded DFloat11's way, to time its decoder (zipccl_jax/bench/gpu_anchors.py)")
    g = b.add_argument_group("static-codes")
    g.add_argument("--family", type=_ints, default=[4, 8, 16], metavar="K[,K...]",
                   help="family sizes to report, of 4, 8, 16")
    g.add_argument("--emit-family", action="store_true",
                   help="print format version 6's family (K = 4, reference.FAMILY_HEX) derived from the corpus")
    g = b.add_argument_group("schedule")
    g.add_argument("--topology", default="1x1x8", help="slices x hosts x GPUs per host (1x2x8: two hosts of 8)")
    g.add_argument("--step", choices=["mlp", "lm"], default="mlp",
                   help="mlp: 4 layers, one collective per layer's gradient; lm: bench/lm.py's step")
    g.add_argument("--collective", default="psum",
                   choices=["psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"],
                   help="mlp: the collective each layer's gradient crosses")
    g.add_argument("--command-buffer", default=None, metavar="FUSION,CUSTOM_CALL,...",
                   help="XLA's xla_gpu_enable_command_buffer for the compile ('' : none; default: XLA's)")
    g.add_argument("--gpu-compiler-options", action="store_true",
                   help="compile both steps with zipccl_jax.GPU_COMPILER_OPTIONS (XLA:GPU's latency-hiding scheduler "
                        "on: without it a module holding a ragged_all_to_all overlaps no collective; docs/GPU.md). "
                        "The import already sets it in XLA_FLAGS; ZIPCCL_XLA_FLAGS=0 shows XLA's defaults")
    g.add_argument("--compiler-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an XLA compile option for both steps (repeatable), e.g. "
                        "xla_gpu_enable_latency_hiding_scheduler=true")
    g.add_argument("--thunks", action="store_true",
                   help="also dump the thunk sequence and count the thunks command buffers captured")
    g.add_argument("--fn", default=None, metavar="MODULE:FUNCTION",
                   help="compile a user's step: FUNCTION(mesh, sync) -> (jitted fn, arg specs), sync 'lax'/'zip'")
    t = sub.add_parser("selftest", help="check the codec and every collective against the reference on the local "
                                         "devices (the GPUs if any), time the codec, run autotune; a verdict")
    t.add_argument("--elements", type=int, default=1 << 24, help="bfloat16 values for the timing")
    t.add_argument("--repeat", type=int, default=5,
                   help="timed calls per measurement (GPU: their mean between CUDA events; CPU: their median)")
    t.add_argument("--platform", choices=["cpu", "gpu"], default=None,
                   help="check this platform's devices (default: the GPUs if JAX sees any, else the CPU's)")
    c = sub.add_parser("calibrate", help="autotune over this process's devices and write the profile")
    c.add_argument("--output", default=None, help="profile path (default: $ZIPCCL_PROFILE or ~/.cache)")
    c.add_argument("--platform", choices=["cpu", "gpu"], default=None,
                   help="calibrate this platform's devices (default: the default platform's)")
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    if args.command == "selftest" or args.command == "bench" and args.what in ("collectives", "train", "wire"):
        from .bench.devices import ask_for_virtual_cpus

        ask_for_virtual_cpus(8)  # where the default platform has fewer than two devices (bench/devices.py)
    if args.command == "selftest":
        from . import selftest

        raise SystemExit(selftest.main(args.elements, args.repeat, platform=args.platform))
    if args.command == "calibrate":
        from .autotune import main as calibrate

        calibrate(args.output, args.platform)
    elif args.what == "codec":
        from .bench import codec

        if args.against:
            codec.run_against(args.against, args.elements, args.repeat, args.core, args.rounds, args.json)
        else:
            codec.run_codec(args.elements, args.repeat, args.core, args.json, args.plot, args.lm_steps)
    elif args.what == "collectives":
        from .bench import collectives

        collectives.run_collectives(args.sizes, args.repeat, args.data, args.collectives, args.json, args.plot,
                                    args.platform)
    elif args.what == "train":
        from .bench import train

        train.run(args)
    elif args.what == "wire":
        from .bench import wire

        wire.run(args)
    elif args.what == "schedule":
        from .bench import schedule

        schedule.run(args)
    elif args.what == "static-codes":
        from .bench import static_codes

        static_codes.run(args.family, args.json, args.lm_steps, emit_family=args.emit_family, against=args.against)
    elif args.what == "gpu":
        from .bench import gpu

        gpu.run(args)
    else:
        from .bench import net

        net.run_cli(args)


if __name__ == "__main__":
    main()
