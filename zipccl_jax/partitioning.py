"""Custom partitioning for the codec ops under jit with sharded inputs.

A bare custom call is opaque to XLA's partitioner, which then gathers its
operands onto every device. The codec ops are independent per row (the
leading batch axes), so each device can code its own shard: the rule below
keeps the batch axes' sharding and replicates only the per-stream axis.
"""

from __future__ import annotations

import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def _in_manual_context() -> bool:
    """Inside shard_map every device already holds its own shard."""
    mesh = jax.sharding.get_abstract_mesh()
    return bool(getattr(mesh, "manual_axes", ()))


def _batch_spec(sharding, rank: int, batch_rank: int) -> tuple:
    spec = tuple(getattr(sharding, "spec", ())) + (None,) * rank
    return spec[:batch_rank]


def rowwise(fn, item_rank_in: int, item_ranks_out: tuple[int, ...]):
    """Wraps fn(x, **static) so that its leading axes partition freely.

    item_rank_in: trailing axes of x that one call needs whole;
    item_ranks_out: the same for each output (the batch axes come first).
    """

    @functools.cache
    def partitioned(rank: int, static_items: tuple):
        static = dict(static_items)
        batch_rank = rank - item_rank_in

        @custom_partitioning
        def op(x):
            return fn(x, **static)

        def shardings(mesh, arg_shapes):
            batch = _batch_spec(arg_shapes[0].sharding, rank, batch_rank)
            arg = NamedSharding(mesh, P(*batch, *(None,) * item_rank_in))
            outs = tuple(NamedSharding(mesh, P(*batch, *(None,) * r)) for r in item_ranks_out)
            return arg, outs

        def partition(mesh, arg_shapes, result_shape):
            arg, outs = shardings(mesh, arg_shapes)
            return mesh, lambda x: fn(x, **static), _single(outs), (arg,)

        def infer(mesh, arg_shapes, result_shape):
            return _single(shardings(mesh, arg_shapes)[1])

        letters = [f"b{i}" for i in range(batch_rank)]
        ins = " ".join(letters + [f"i{j}" for j in range(item_rank_in)])
        outs = ", ".join(" ".join(letters + [f"o{k}_{j}" for j in range(r)]) for k, r in enumerate(item_ranks_out))
        op.def_partition(
            partition=partition,
            infer_sharding_from_operands=infer,
            sharding_rule=f"{ins} -> {outs}",
        )
        return op

    def _single(outs):
        return outs[0] if len(outs) == 1 else outs

    @functools.cache
    def batchable(rank: int, static_items: tuple):
        # custom_partitioning has no batching rule; a vmapped row-wise op is
        # the same op with one more batch axis.
        @jax.custom_batching.custom_vmap
        def op(x):
            return partitioned(rank, static_items)(x)

        @op.def_vmap
        def _(axis_size, in_batched, x):
            out = call(x, **dict(static_items))
            return out, jax.tree.map(lambda _: True, out)

        return op

    def call(x, **static):
        if _in_manual_context() or x.ndim == item_rank_in:
            return fn(x, **static)
        return batchable(x.ndim, tuple(sorted(static.items())))(x)

    return call
