"""Experts: the interface the sampler calls, and toy experts with enumerable distributions."""

from smc_jax.experts.base import ExpertGroup, ExpertStack, eos_symbol, stack_experts, take_particles, where_active
from smc_jax.experts.toy import NGramExpert, TableExpert

__all__ = [
    "ExpertGroup", "ExpertStack", "eos_symbol", "stack_experts", "take_particles", "where_active",
    "NGramExpert", "TableExpert",
]
