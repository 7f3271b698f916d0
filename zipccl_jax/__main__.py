"""Command line: python -m zipccl_jax bench codec [options]."""

import argparse

from . import bench


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zipccl_jax")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=["codec"], help="codec: ratios and single-core speeds vs baselines")
    b.add_argument("--elements", type=int, default=1 << 24, help="Gaussian values per dtype")
    b.add_argument("--repeat", type=int, default=7, help="timed runs per measurement (median)")
    b.add_argument("--core", type=int, default=None, help="pin to this CPU core")
    args = parser.parse_args(argv)
    if args.command == "bench" and args.what == "codec":
        bench.run_codec(args.elements, args.repeat, args.core)


if __name__ == "__main__":
    main()
