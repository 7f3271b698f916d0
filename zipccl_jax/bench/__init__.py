"""Tools around the library, not part of its API: the benchmarks behind
`python -m zipccl_jax bench ...` (codec, collectives, train, net, static-codes), the codec
baselines they compare with, their data (Gaussian, special values, real
weights), a small demo language model, the network-namespace harness and the
report helpers. Nothing in `zipccl_jax` proper imports from here."""
