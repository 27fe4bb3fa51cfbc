"""Experts: the interface the sampler calls, toy experts with enumerable distributions, and
constraint experts (0/1 potentials from automata)."""

from smc_jax.experts.base import ExpertGroup, ExpertStack, eos_symbol, stack_experts, take_particles, where_active
from smc_jax.experts.teacher_forcing import Scores, pad_sequences, sequence_logprobs, target_symbols, teacher_force
from smc_jax.experts.toy import NGramExpert, TableExpert

__all__ = [
    "ExpertGroup", "ExpertStack", "eos_symbol", "stack_experts", "take_particles", "where_active",
    "NGramExpert", "TableExpert", "Scores", "pad_sequences", "sequence_logprobs", "target_symbols",
    "teacher_force",
]  # the constraint expert (experts.constraint) is public as smc_jax.constraints
