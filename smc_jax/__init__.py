"""smc_jax: ensembling language models with sequential Monte Carlo, in JAX."""
from smc_jax.models import load_model
