"""jaxembed: instruction-based multi-task text-embedding training in JAX/Flax."""

__version__ = "0.1.0"
