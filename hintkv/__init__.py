"""hintkv: an LLM inference server for agent swarms whose KV cache follows what the agents do."""

from hintkv.openmp_env import bound_openmp_spin

bound_openmp_spin()  # before torch loads libgomp (hintkv imports torch only below this package)

__version__ = "0.1.0"
