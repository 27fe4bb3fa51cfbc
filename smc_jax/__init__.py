"""smc_jax: ensembling language models with sequential Monte Carlo, in JAX.

Importing it keeps XLA's compiled programs on disk (`$SMC_JAX_CACHE_DIR/xla`, default
~/.cache/smc_jax/xla) unless SMC_JAX_NO_CACHE=1 or a JAX compilation cache is set already.
"""

from smc_jax.smc.ensemble import NAMED_TAUS, ConstrainedEnsemble, CustomEnsemble, GeneralizedMean, contrastive, make_ensemble
from smc_jax.experts import ExpertGroup, ExpertStack, NGramExpert, TableExpert
from smc_jax.models import load_model
from smc_jax.models.weights_cache import keep_compiled_programs
from smc_jax.sampler import EnsembleSampler, Expert, logprob, sample
from smc_jax.scoring import ByteScorer, logprob_batch
from smc_jax import constraints
from smc_jax.smc import SMC, SMCResult, ZeroWeightError, importance_sampling, local_ensemble

__all__ = [
    "NAMED_TAUS", "ConstrainedEnsemble", "CustomEnsemble", "constraints", "GeneralizedMean", "contrastive", "make_ensemble",
    "ExpertGroup", "ExpertStack", "NGramExpert", "TableExpert", "load_model",
    "EnsembleSampler", "Expert", "logprob", "sample", "ByteScorer", "logprob_batch",
    "SMC", "SMCResult", "ZeroWeightError", "importance_sampling", "local_ensemble",
]

keep_compiled_programs()
