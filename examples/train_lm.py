"""Train a small GPT-style model on Shakespeare, data-parallel, with compressed gradient sync.

    python examples/train_lm.py --steps 50                 # all GPUs, or 8 virtual CPU devices (fewer than 2 GPUs)
    python examples/train_lm.py --steps 50 --no-compress   # same algorithm, codec off: same bits
    python examples/train_lm.py --sync lax                 # lax.psum instead of zip_psum
    python examples/train_lm.py --sync compressed          # the lax step wrapped in zipccl_jax.compressed

Across processes (CPU: gloo), one command per process:

    python examples/train_lm.py --coordinator 127.0.0.1:5000 --num-processes 2 --process-id 0 --devices 4
    python examples/train_lm.py --coordinator 127.0.0.1:5000 --num-processes 2 --process-id 1 --devices 4

Prints each step's loss and the bytes this device sent against the raw
algorithm, then a checksum of the final parameters' bits: it is the same with
and without --no-compress, and the same in one process or several.
"""

import argparse
import os


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--no-compress", action="store_true", help="run zip_psum's plan with the codec off")
    p.add_argument("--sync", choices=["zip", "lax", "compressed"], default="zip",
                   help="zip_psum (default), lax.psum, or the lax step wrapped in zipccl_jax.compressed "
                        "(the same bits as zip)")
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16", help="dtype the gradients are sent in")
    p.add_argument("--devices", type=int, default=8, help="virtual CPU devices per process (CPU only)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-per-device", type=int, default=8)
    p.add_argument("--coordinator", help="HOST:PORT of process 0, for a multi-process run")
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    # Must be set before jax starts; harmless on GPU hosts (CPU devices only).
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    import jax
    import numpy as np

    if args.coordinator:
        jax.distributed.initialize(args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id, initialization_timeout=60)
    from zipccl_jax.bench import devices as device_choice
    from zipccl_jax.bench import lm

    cfg = lm.Config(d_model=args.d_model, seq_len=args.seq_len, batch_per_device=args.batch_per_device,
                    grad_dtype={"bf16": "bfloat16", "f32": "float32"}[args.dtype])
    devices, note = device_choice.choose()
    n = len(devices)
    mesh = jax.make_mesh((n,), ("data",), devices=devices)
    tokens = lm.load_tokens()
    params = lm.replicate(mesh, lm.init_params(jax.random.key(0), cfg))
    opt = lm.replicate(mesh, lm.init_opt(params))
    step = lm.make_step(mesh, cfg, sync=args.sync, compress=not args.no_compress)
    def local(a):  # this process's copy of a replicated value
        return np.asarray(a.addressable_data(0))

    log = print if jax.process_index() == 0 else (lambda *a, **k: None)
    log(f"devices: {device_choice.describe(devices)} in {jax.process_count()} process(es)"
        f"{f' ({note})' if note else ''}; "
        f"{sum(a.size for a in jax.tree.leaves(params)):,} parameters; {tokens.size:,} tokens")
    for i in range(args.steps):
        params, opt, loss, *stats = step(params, opt, lm.shard_batch(mesh, lm.batch_at(tokens, cfg, i, n)))
        loss = local(loss)
        wire = "" if not stats else (f"  wire {local(stats[0].wire_bytes):,.0f} B vs raw "
                                     f"{local(stats[0].raw_bytes):,.0f} B")
        log(f"step {i:4d}  loss {loss:.6f} (bits {loss.view(np.uint32):08x}){wire}")
    log(f"params checksum: {lm.checksum(params)}")
    if args.coordinator:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
