"""Command line: python -m zipccl_jax {bench codec|bench collectives|calibrate} [options]."""

import argparse

from . import bench


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zipccl_jax")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=["codec", "collectives"],
                   help="codec: ratios and single-core speeds vs baselines; collectives: wire bytes and time vs lax")
    b.add_argument("--elements", type=int, default=1 << 24, help="Gaussian values per dtype")
    b.add_argument("--repeat", type=int, default=7, help="timed runs per measurement (median)")
    b.add_argument("--core", type=int, default=None, help="pin to this CPU core")
    b.add_argument("--sizes", type=lambda s: [int(float(v)) for v in s.split(",")],
                   default=[4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20], help="bytes per device, comma-separated")
    b.add_argument("--data", choices=["gaussian", "minilm"], default="gaussian")
    b.add_argument("--collectives", type=lambda s: s.split(","), default=None,
                   help="comma-separated subset of psum,all_gather,psum_scatter,all_to_all,ppermute")
    c = sub.add_parser("calibrate", help="measure the cost model's constants and write the profile")
    c.add_argument("--output", default=None, help="profile path (default: $ZIPCCL_PROFILE or ~/.cache)")
    args = parser.parse_args(argv)
    if args.command == "bench" and args.what == "codec":
        bench.run_codec(args.elements, args.repeat, args.core)
    elif args.command == "bench":
        bench.run_collectives(args.sizes, args.repeat, args.data, args.collectives)
    else:
        from pathlib import Path

        from . import calibrate

        calibrate.main(Path(args.output) if args.output else None)


if __name__ == "__main__":
    main()
