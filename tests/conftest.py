import os

# Multi-device tests run on 8 virtual CPU devices; must be set before jax starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
