"""The SMC engine: state, one jitted step, the loop, resampling, results."""

from smc_jax.smc.engine import SMC, importance_sampling, local_ensemble, run_batch, run_jitted
from smc_jax.smc.resampling import RESAMPLERS, effective_sample_size, get_resampler
from smc_jax.smc.result import SMCResult, ZeroWeightError
from smc_jax.smc.state import PAD_SYMBOL, SMCState, Trace

__all__ = [
    "SMC", "importance_sampling", "local_ensemble", "run_batch", "run_jitted", "RESAMPLERS",
    "effective_sample_size", "get_resampler", "SMCResult", "ZeroWeightError", "PAD_SYMBOL",
    "SMCState", "Trace",
]
