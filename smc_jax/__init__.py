"""smc_jax: ensembling language models with sequential Monte Carlo, in JAX."""
