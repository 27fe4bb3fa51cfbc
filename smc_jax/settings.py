"""The sampler's settings: one frozen object, so every default is defined once.

`sample()`, `EnsembleSampler` and the `smc-jax sample` command all read their defaults from
`SamplerSettings` (the CLI's flags default to `DEFAULTS`' fields), so a run with default
settings draws the same samples whichever door it comes through.

The defaults, and why:

* ``max_length=64``: long enough for a sentence in bytes or tokens.
* ``at_max_length="eos"``: EOS is forced at the limit with its weight factor, so the sampler
  targets phi restricted to strings of length <= L, unbiasedly. "truncate" targets a different
  (prefix) distribution and marks strings unfinished.
* ``beam_width=5``, ``prune_threshold=0.05``: the paper's byte-level experiments (and GenLM's
  defaults in our comparisons).
* ``heal=True``: token healing, as in genlm-bytes: a byte that no kept hypothesis can read gets
  the probability of a re-tokenized path instead of 0 (it changes nothing otherwise).
* ``ess_threshold=0.9``, ``resampler="multinomial"``, ``resample_finished=True``: the paper's
  Alg. 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

from smc_jax.bytes.beam import BeamConfig
from smc_jax.smc.engine import SMC

Level = Literal["token", "byte", "local"]
LEVELS = ("token", "byte", "local")

#: Beam settings of the paper's byte-level experiments (and GenLM's defaults in our comparisons).
DEFAULT_BEAM_WIDTH = 5
DEFAULT_PRUNE_THRESHOLD = 0.05
#: Context-store growth factor when a run overflows its starting capacity.
CAPACITY_GROWTH = 2
#: Largest context-store scale tried before an overflow is reported.
MAX_CAPACITY_SCALE = 64
#: Starting byte-level contexts per particle and unit of beam width in the sampler. Particles
#: share contexts (resampled copies, continuing hypotheses), so a run of M = 10, beam 5 peaked at
#: 15-26 of its 102 contexts a store, 54-60 without resampling; an overflow doubles the stores.
SAMPLER_CONTEXTS_PER_BEAM_SLOT = 1
#: Starting contexts per unit of beam width in the scorer (one beam, so its hypotheses share less).
SCORER_CONTEXTS_PER_BEAM_SLOT = 3


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
    """How an ensemble is sampled (everything but the experts, f and their weights).

    Parameters
    ----------
    level : {"byte", "token", "local"}
        "byte": exact across tokenizers; "token": experts share one tokenizer; "local": the
        token-local baseline (weights ignored).
    num_particles : int
        M, the number of particles.
    max_length : int
        L, the longest continuation: in bytes (byte level) or tokens.
    ess_threshold : float
        Resample when ESS < ess_threshold * M (0 = importance sampling).
    resampler : str
        "multinomial", "systematic", "stratified" or "residual".
    resample_finished : bool
        True (Alg. 1) resamples all particles; False only those still extending.
    at_max_length : {"eos", "truncate"}
        At the limit: force EOS with its weight factor, or stop without it (prefix target).
    temperature : float
        Temperature of every expert (> 0).
    beam_width : int
        Byte level: the beam width B of each expert's tokenization beam.
    prune_threshold : float
        Byte level: hypotheses below this fraction of the beam's mass are pruned, in [0, 1).
    heal : bool
        Byte level: token healing (`smc_jax.bytes.healing`) when a byte empties a beam: back off
        into a hypothesis' current token and re-read it with another tokenization (genlm-bytes'
        adaptive healing; it changes nothing while some hypothesis can read the byte).
    prompt_as_bytes : bool
        Byte level: read raw-text prompts through the byte beam from BOS (GenLM's convention)
        instead of tokenizing them canonically.
    prefetch : int
        Byte level: when a step calls the model anyway, also create the contexts the next
        `prefetch` bytes may need (the tokens along the beams' likeliest continuations; 0 = off;
        `smc_jax.experts.byte.ByteExperts.prefetch_depth`), and after them, by tree attention
        in the same call, likely tokens right after those (`prefetch_children`). Fewer
        sequential model calls; the same distributions, up to float rounding (a prefetched
        context is computed in a batch of another size).
    prefetch_rows : int
        Byte level, with `prefetch`: rows a call may add for prefetching beyond its batch's
        padding (0 = only fill the padding; the batch then takes the smallest size that holds
        them, at most 4 times the number of particles).
    prefetch_slots : int
        Byte level, with `prefetch`: prefetched contexts kept per particle and expert (the
        prefetch cache holds `prefetch_slots * num_particles` candidates, heaviest first).
    prefetch_children : int
        Byte level, with `prefetch`: contexts per particle and expert prefetched one token below
        the best candidates, by tree attention in the same call (0 = none).
    row_buckets : bool
        Byte level: the step program holds one model forward per row-count bucket, and a call
        runs the smallest that holds its rows, instead of one forward reading M rows at a time
        and its half-size twin for a call's last rows. A larger program (the first call without
        a cache 92 s against 64 s: two prompts of SmolLM2, M = 10, 40 bytes) that computes the
        same rows there and ran 3.28 +- 0.31 s a run against 3.60 +- 0.23 s (no difference
        shown); a call of more than M rows runs one forward, not several.
    progress : bool
        Report each step to `smc_jax.smc.progress` listeners (one dispatch per step; no host call inside a program).
    """

    level: Level = "byte"
    num_particles: int = 10
    max_length: int = 64
    ess_threshold: float = 0.9
    resampler: str = "multinomial"
    resample_finished: bool = True
    at_max_length: str = "eos"
    temperature: float = 1.0
    beam_width: int = DEFAULT_BEAM_WIDTH
    prune_threshold: float = DEFAULT_PRUNE_THRESHOLD
    heal: bool = True
    prompt_as_bytes: bool = False
    prefetch: int = 0
    prefetch_rows: int = 0
    prefetch_slots: int = 4
    prefetch_children: int = 1
    row_buckets: bool = False
    progress: bool = False

    def __post_init__(self):
        # Every check that needs no model runs here, so a bad setting fails before any loading.
        if self.level not in LEVELS:
            raise ValueError(f"unknown level {self.level!r}; use one of {LEVELS}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if self.level == "byte" and not (self.beam_width >= 1 and 0 <= self.prune_threshold < 1):
            raise ValueError(
                f"beam_width must be >= 1 and prune_threshold in [0, 1), got {self.beam_width!r} and "
                f"{self.prune_threshold!r}"
            )
        for name in ("heal", "row_buckets"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        counts = (self.prefetch, self.prefetch_rows, self.prefetch_slots, self.prefetch_children)
        if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise ValueError(
                "prefetch, prefetch_rows, prefetch_slots and prefetch_children must be integers >= 0, got "
                f"{self.prefetch!r}, {self.prefetch_rows!r}, {self.prefetch_slots!r}, {self.prefetch_children!r}"
            )
        if self.prefetch and self.prefetch_slots < 1:
            raise ValueError("prefetch needs prefetch_slots >= 1 (the contexts it keeps per particle); or set prefetch=0")
        byte_only = {
            "row_buckets sizes the byte step's model calls": self.row_buckets,
            "heal=False turns off the byte beams' token healing": not self.heal,
            "prefetch creates the byte beams' contexts ahead of time": self.prefetch,
            "prompt_as_bytes reads prompts through the byte beam": self.prompt_as_bytes,
        }
        for what, used in byte_only.items():
            if used and self.level != "byte":
                raise ValueError(f"{what}: it needs level='byte'")
        self.smc()  # M, L, ESS threshold, resampler and at_max_length are checked by the engine

    def replace(self, **changes: Any) -> SamplerSettings:
        """A copy with `changes` (setting names as keywords); an unknown name is a TypeError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown sampler setting(s) {sorted(unknown)}; known: {names()}")
        return dataclasses.replace(self, **changes) if changes else self

    def smc(self) -> SMC:
        """The engine configuration of these settings."""
        return SMC(
            num_particles=self.num_particles,
            max_length=self.max_length,
            ess_threshold=self.ess_threshold,
            resampler=self.resampler,
            method="local" if self.level == "local" else "smc",
            at_max_length=self.at_max_length,
            progress=self.progress,
            resample_finished=self.resample_finished,
        )

    def beam(self) -> BeamConfig:
        """The byte level's beam configuration."""
        return BeamConfig(width=self.beam_width, threshold=self.prune_threshold, heal=self.heal)


def names() -> list[str]:
    """The setting names, in declaration order."""
    return [f.name for f in dataclasses.fields(SamplerSettings)]


#: The defaults (read by the CLI's flags and `sample()`'s keywords).
DEFAULTS = SamplerSettings()
