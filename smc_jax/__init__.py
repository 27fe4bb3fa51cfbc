"""smc_jax: ensembling language models with sequential Monte Carlo, in JAX."""

from smc_jax.smc.ensemble import NAMED_TAUS, ConstrainedEnsemble, CustomEnsemble, GeneralizedMean, contrastive, make_ensemble
from smc_jax.experts import ExpertGroup, ExpertStack, NGramExpert, TableExpert
from smc_jax.models import load_model
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
