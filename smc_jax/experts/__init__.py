"""Experts: the interface the sampler calls, and toy experts with enumerable distributions."""

from smc_jax.experts.base import ExpertGroup, ExpertStack, eos_symbol, stack_experts, take_particles, where_active
from smc_jax.experts.scoring import Scores, pad_sequences, sequence_logprobs, target_symbols, teacher_force
from smc_jax.experts.toy import NGramExpert, TableExpert

__all__ = [
    "ExpertGroup", "ExpertStack", "eos_symbol", "stack_experts", "take_particles", "where_active",
    "NGramExpert", "TableExpert", "Scores", "pad_sequences", "sequence_logprobs", "target_symbols",
    "teacher_force",
]
