"""zipccl_jax"""
