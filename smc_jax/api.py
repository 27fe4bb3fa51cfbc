"""The ensemble sampler in a few calls: experts are (model, prompt) pairs.

    import smc_jax as sj
    smol = sj.load_model("smollm2-135m-instruct")
    result = sj.sample([(smol, "My favorite physicist is"), (smol, "My favorite author is")],
                       f="product", level="token", num_particles=10, max_length=24, seed=0)
    result.posterior(); result.log_Z; result.expected_accuracy(predicate)

Levels: "token" (all experts share one tokenizer; symbols are tokens), "byte" (always possible;
models with different tokenizers are combined exactly through beams over tokenizations) and
"local" (the token-local baseline: f of the next-token conditionals, weights ignored). Experts
that share a model form one group: their prompts are batched through one set of parameters
(vmapped over the expert axis) with one model call per step for all of them.
"""

from __future__ import annotations

import dataclasses
import math
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from smc_jax.bytes.beam import BeamConfig
from smc_jax.experts.byte import ByteExperts, ByteLogprob, byte_logprob
from smc_jax.bytes.trie import TokenTrie
from smc_jax.bytes.vocab import token_byte_strings
from smc_jax.ensemble import Ensemble, make_ensemble
from smc_jax.experts.base import ExpertStack
from smc_jax.experts.token import TokenExperts
from smc_jax.models.cache import CacheCapacityError
from smc_jax.models.lm import LanguageModel, prompt_bucket
from smc_jax.models.paged import PagedTransformer
from smc_jax.models import transformer
from smc_jax.sharding import ParamRules, check_mesh, resolve_rules, sample_sharded, shard_experts
from smc_jax.smc.engine import SMC
from smc_jax.smc.result import SMCResult

Prompt = str | Sequence[Mapping[str, str]]
Level = Literal["token", "byte", "local"]
LEVELS = ("token", "byte", "local")

#: Beam settings of the paper's byte-level experiments (and GenLM's defaults in our comparisons).
DEFAULT_BEAM_WIDTH = 5
DEFAULT_PRUNE_THRESHOLD = 0.05
#: Context-store growth factor when a run overflows its starting capacity.
CAPACITY_GROWTH = 2
#: Largest context-store scale tried before an overflow is reported.
MAX_CAPACITY_SCALE = 64
#: Starting byte-level context capacity per particle and unit of beam width.
CONTEXTS_PER_BEAM_SLOT = 3


@dataclasses.dataclass(frozen=True)
class Expert:
    """One expert: a model under a prompt (raw text, or chat messages for its chat template)."""

    model: LanguageModel
    prompt: Prompt

    def prompt_ids(self) -> list[int]:
        return self.model.encode_prompt(self.prompt)


def as_experts(experts: Sequence[Expert | tuple[LanguageModel, Prompt]]) -> list[Expert]:
    if experts is None or len(experts) == 0:
        raise ValueError("an ensemble needs at least one expert: pass [(model, prompt), ...]")
    out = []
    for i, e in enumerate(experts):
        if isinstance(e, Expert):
            out.append(e)
        elif isinstance(e, (tuple, list)) and len(e) == 2 and isinstance(e[0], LanguageModel):
            out.append(Expert(model=e[0], prompt=e[1]))
        else:
            raise TypeError(f"expert {i} must be (model, prompt) with a model from smc_jax.load_model, got {e!r}")
    return out


def _groups(experts: list[Expert]) -> list[tuple[LanguageModel, list[int]]]:
    """Experts grouped by model (first-appearance order) with their indices."""
    groups: dict[int, tuple[LanguageModel, list[int]]] = {}
    for i, e in enumerate(experts):
        groups.setdefault(id(e.model), (e.model, []))[1].append(i)
    return list(groups.values())


def _same_tokenizer(a: LanguageModel, b: LanguageModel) -> bool:
    if a is b:
        return True
    if a.tokenizer is None or b.tokenizer is None or a.config.vocab_size != b.config.vocab_size:
        return False
    return a.tokenizer.hf.get_vocab() == b.tokenizer.hf.get_vocab()


_prefill_prompts = jax.jit(
    jax.vmap(transformer.prefill, in_axes=(None, None, 0, 0)), static_argnames="config"
)


def prefill_prompts(
    model: LanguageModel, prompts: Sequence[Prompt] | Sequence[Sequence[int]], max_new_tokens: int, token_ids: bool = False
):
    """Prompt caches of K prompts padded to one bucket size, stacked, and their next-token logits
    (prompts are text or chat messages, or token ids when `token_ids`)."""
    ids = [list(p) for p in prompts] if token_ids else [model.encode_prompt(p) for p in prompts]
    for i, seq in enumerate(ids):
        if len(seq) == 0:
            raise ValueError(f"prompt {i} is empty after tokenization; give it some text")
        if model.config.learned_positions and len(seq) + max_new_tokens > model.config.max_positions:
            raise CacheCapacityError(
                f"prompt {i} ({len(seq)} tokens) plus max_length {max_new_tokens} exceeds the "
                f"{model.config.max_positions} positions of {model.name}; shorten the prompt or max_length"
            )
    size = max(prompt_bucket(len(seq), model.prompt_capacity) for seq in ids)
    padded = np.zeros((len(ids), size), np.int32)
    for i, seq in enumerate(ids):
        padded[i, : len(seq)] = seq
    lengths = jnp.asarray([len(seq) for seq in ids], jnp.int32)
    return _prefill_prompts(model.params, model.config, jnp.asarray(padded), lengths)


_BYTE_VOCABS: "weakref.WeakKeyDictionary[LanguageModel, tuple[TokenTrie, np.ndarray]]" = weakref.WeakKeyDictionary()


def byte_vocabulary(model: LanguageModel) -> tuple[TokenTrie, np.ndarray]:
    """The model's token trie and the mask of ids a byte-level LM may use (byte tokens + EOS)."""
    if model not in _BYTE_VOCABS:
        if model.tokenizer is None:
            raise ValueError(f"{model.name} has no tokenizer, so its tokens' bytes are unknown")
        vocab = token_byte_strings(model.tokenizer.hf, vocab_size=model.config.vocab_size)
        allowed = np.array([b is not None for b in vocab.byte_strings])
        allowed[list(model.tokenizer.eos_token_ids)] = True
        _BYTE_VOCABS[model] = (TokenTrie.build(vocab.byte_strings), allowed)
    return _BYTE_VOCABS[model]


@dataclasses.dataclass(frozen=True)
class EnsembleSampler:
    """A reusable sampler for fixed experts and settings (compiled once, then one call per seed).

    See `sample` for the arguments. `sampler(seed)` returns an `SMCResult` whose texts are
    decoded strings and whose `expert_logprobs[:, k]` follow the order of `experts`.

    mesh: a device mesh from `smc_jax.sharding.make_mesh` to split the particles over (M must be
    a multiple of its "particles" size); sharding_rules: how model weights use its "model" axis
    ("replicated", "tensor_parallel" or a rule table; see `smc_jax.sharding`). Same seed, same
    result with or without a mesh. resample_finished: True (the paper's Alg. 1) resamples all
    particles; False only those still extending (see `smc_jax.smc.engine`).
    """

    experts: tuple[Expert, ...]
    f: str | float | Ensemble = "product"
    weights: tuple[float, ...] | None = None
    level: Level = "byte"
    num_particles: int = 10
    ess_threshold: float = 0.9
    resampler: str = "multinomial"
    max_length: int = 64
    temperature: float = 1.0
    beam_width: int = DEFAULT_BEAM_WIDTH
    prune_threshold: float = DEFAULT_PRUNE_THRESHOLD
    heal: bool = True  # token healing in byte beams (smc_jax.bytes.healing)
    at_max_length: str = "eos"
    progress: bool = False
    prompt_as_bytes: bool = False
    resample_finished: bool = True
    mesh: Mesh | None = None
    sharding_rules: str | ParamRules = "replicated"

    def __post_init__(self):
        object.__setattr__(self, "experts", tuple(as_experts(self.experts)))
        object.__setattr__(self, "sharding_rules", resolve_rules(self.sharding_rules))
        if self.mesh is not None:
            check_mesh(self.mesh, self.num_particles)
        if self.level not in LEVELS:
            raise ValueError(f"unknown level {self.level!r}; use one of {LEVELS}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.level != "byte":
            first = self.experts[0].model
            for e in self.experts[1:]:
                if not _same_tokenizer(first, e.model):
                    raise ValueError(
                        f"level={self.level!r} needs experts that share one tokenizer, but {first.name} and "
                        f"{e.model.name} tokenize differently; use level='byte' to ensemble them exactly"
                    )
        if self.level == "byte" and not (self.beam_width >= 1 and 0 <= self.prune_threshold < 1):
            raise ValueError("beam_width must be >= 1 and prune_threshold in [0, 1)")
        if self.prompt_as_bytes:
            if self.level != "byte":
                raise ValueError("prompt_as_bytes reads prompts through the byte beam: it needs level='byte'")
            if any(not isinstance(e.prompt, str) for e in self.experts):
                raise ValueError("prompt_as_bytes takes raw-text prompts (chat templates hold control tokens)")
        groups = _groups(list(self.experts))
        order = [i for _, idx in groups for i in idx]
        weights = None if self.weights is None else [self.weights[i] for i in order]
        object.__setattr__(self, "_groups", groups)
        object.__setattr__(self, "_order", np.asarray(order))
        object.__setattr__(self, "_ensemble", make_ensemble(self.f, len(self.experts), weights))
        object.__setattr__(self, "_smc", SMC(
            num_particles=self.num_particles,
            max_length=self.max_length,
            ess_threshold=self.ess_threshold,
            resampler=self.resampler,
            method="local" if self.level == "local" else "smc",
            at_max_length=self.at_max_length,
            progress=self.progress,
            resample_finished=self.resample_finished,
        ))
        object.__setattr__(self, "_capacity", {"scale": 1})
        object.__setattr__(self, "_built", {})

    @property
    def ensemble(self) -> Ensemble:
        return self._ensemble

    @property
    def smc(self) -> SMC:
        return self._smc

    def _group(self, model: LanguageModel, indices: list[int], scale: int):
        prompts = [self.experts[i].prompt for i in indices]
        prompt_bytes = prompt_lengths = None
        max_tokens = self.max_length
        if self.prompt_as_bytes:
            # GenLM's convention: the model sees only BOS; the prompt's bytes go through the beam.
            bos = model.tokenizer.bos_token_id if model.tokenizer else None
            if bos is None:
                raise ValueError(f"{model.name} has no BOS token to start a byte-level prompt from")
            encoded = [p.encode("utf-8") for p in prompts]
            prompt_bytes = np.zeros((len(encoded), max(1, max(len(b) for b in encoded))), np.int32)
            for i, b in enumerate(encoded):
                prompt_bytes[i, : len(b)] = list(b)
            prompt_lengths = jnp.asarray([len(b) for b in encoded], jnp.int32)
            prompt_bytes = jnp.asarray(prompt_bytes)
            max_tokens += prompt_bytes.shape[1]
            prefixes, logits = prefill_prompts(model, [[bos]] * len(prompts), max_tokens, token_ids=True)
        else:
            prefixes, logits = prefill_prompts(model, prompts, self.max_length)
        paged = PagedTransformer(params=model.params, config=model.config)
        eos = tuple(model.tokenizer.eos_token_ids) if model.tokenizer else ()
        if not eos:
            raise ValueError(f"{model.name} has no end-of-sequence token; cannot end strings")
        m = self.num_particles
        if self.level == "byte":
            trie, allowed = byte_vocabulary(model)
            # Starting capacities far below the worst case (1 + M C (1 + 2 D) contexts): a
            # particle's beam holds a few distinct contexts (continuing hypotheses share theirs)
            # plus the few extensions that pass the threshold, and its paths share all but their
            # last tokens. Each context holds a sum tree of the vocabulary (2 MB for Gemma 3), so
            # this matters; a run that overflows is rerun with doubled capacities.
            num_contexts = (1 + CONTEXTS_PER_BEAM_SLOT * m * self.beam_width) * scale
            num_entries = (2 * m * (max_tokens + 1) + num_contexts) * scale
            return ByteExperts(
                model=paged,
                prefixes=prefixes,
                prompt_logits=logits,
                trie=trie,
                allowed=jnp.asarray(allowed),
                eos_ids=eos,
                beam=BeamConfig(width=self.beam_width, threshold=self.prune_threshold, heal=self.heal),
                max_tokens=max_tokens,
                temperature=self.temperature,
                num_entries=num_entries,
                num_contexts=num_contexts,
                prompt_bytes=prompt_bytes,
                prompt_lengths=prompt_lengths,
            ).with_start_state(m)  # the prompt is read once per build, not once per seed
        return TokenExperts(
            model=paged,
            prefixes=prefixes,
            prompt_logits=logits,
            eos_ids=eos,
            max_tokens=self.max_length,
            temperature=self.temperature,
        )

    def build(self, scale: int = 1):
        """The expert groups (one per model) as one expert group for the sampler (prompts are
        prefilled once per capacity scale and reused across seeds)."""
        if scale not in self._built:
            groups = [self._group(model, idx, scale) for model, idx in self._groups]
            built = groups[0] if len(groups) == 1 else ExpertStack(groups=tuple(groups))
            self._built.clear()
            self._built[scale] = built if self.mesh is None else shard_experts(built, self.mesh, self.sharding_rules)
        return self._built[scale]

    def _decode(self) -> Callable[[np.ndarray], str]:
        if self.level == "byte":
            return lambda symbols: bytes(int(s) for s in symbols).decode("utf-8", errors="replace")
        tok = self.experts[0].model.tokenizer
        return lambda symbols: tok.decode([int(s) for s in symbols])

    @property
    def capacity_scale(self) -> int:
        """The context-store scale runs use now (1, doubled each time a run overflowed)."""
        return self._capacity["scale"]

    def grow_on_overflow(self, run: Callable[[Any], Any]) -> Any:
        """`run(experts)`, rebuilt with a bigger context store while it raises an overflow error
        (the store only holds what is alive, so a larger one changes no result)."""
        scale = self._capacity["scale"]
        while True:
            try:
                return run(self.build(scale))
            except RuntimeError as err:
                if "overflowed" not in str(err) or scale >= MAX_CAPACITY_SCALE:
                    raise
                scale *= CAPACITY_GROWTH
                self._capacity["scale"] = scale

    def __call__(self, seed: int | jax.Array = 0, *, allow_zero_weight: bool = False) -> SMCResult:
        key = jax.random.key(seed) if isinstance(seed, int) else seed
        start = time.perf_counter()
        run = self._smc if self.mesh is None else partial(sample_sharded, self._smc, mesh=self.mesh, rules=self.sharding_rules)
        result = self.grow_on_overflow(
            lambda experts: run(key, experts, self._ensemble, decode=self._decode(), allow_zero_weight=allow_zero_weight))
        inverse = np.argsort(self._order)
        stats = dict(result.stats, seconds=time.perf_counter() - start, level=self.level)
        return dataclasses.replace(result, expert_logprobs=result.expert_logprobs[:, inverse], stats=stats)

    def logprob(self, continuation: str | bytes) -> ByteLogprob:
        """Natural-log probabilities of `continuation` (UTF-8 when a str) after the prompt of the
        sampler's single byte-level expert: as a prefix, as a complete string (then EOS), per
        byte, and the next-byte distribution after it (see `ByteLogprob`)."""
        if self.level != "byte" or len(self.experts) != 1:
            raise ValueError("logprob scores under one byte-level expert: EnsembleSampler(experts=(one,), level='byte')")
        data = continuation.encode() if isinstance(continuation, str) else bytes(continuation)
        if len(data) > self.max_length:
            raise ValueError(f"the continuation has {len(data)} bytes, more than max_length={self.max_length}; raise max_length")
        return self.grow_on_overflow(lambda experts: byte_logprob(experts, data))


def logprob(
    model: LanguageModel,
    continuation: str | bytes,
    prompt: Prompt = "",
    *,
    beam_width: int = DEFAULT_BEAM_WIDTH,
    prune_threshold: float = DEFAULT_PRUNE_THRESHOLD,
    temperature: float = 1.0,
    prompt_as_bytes: bool = False,
    heal: bool = True,
) -> ByteLogprob:
    """log P(continuation | prompt) under `model` read as a byte-level LM (natural log).

    `.prefix` is exact (the sum over all tokenizations) when the beam never prunes
    (prune_threshold=0 and a beam wider than the tokenizations alive), a lower bound otherwise;
    `.complete` adds the end of string; `.healed` counts the bytes token healing rescued
    (`heal`, see `smc_jax.bytes.healing`). Compiled programs are cached per model and reused
    across prompts and continuations of similar lengths; for many pairs, `logprob_batch` scores
    several per program run (`smc_jax.scorer`)."""
    from smc_jax.scorer import scorer_for  # the scorer builds on this module

    scorer = scorer_for(model, beam_width=beam_width, prune_threshold=prune_threshold, temperature=temperature,
                        prompt_as_bytes=prompt_as_bytes, heal=heal)
    return scorer(continuation, prompt)


def sample(
    experts: Sequence[Expert | tuple[LanguageModel, Prompt]],
    f: str | float | Ensemble = "product",
    *,
    weights: Sequence[float] | None = None,
    level: Level = "byte",
    num_particles: int = 10,
    ess_threshold: float = 0.9,
    resampler: str = "multinomial",
    max_length: int = 64,
    temperature: float = 1.0,
    seed: int | jax.Array = 0,
    beam_width: int = DEFAULT_BEAM_WIDTH,
    prune_threshold: float = DEFAULT_PRUNE_THRESHOLD,
    at_max_length: str = "eos",
    prompt_as_bytes: bool = False,
    resample_finished: bool = True,
    allow_zero_weight: bool = False,
    mesh: Mesh | None = None,
    sharding_rules: str | ParamRules = "replicated",
) -> SMCResult:
    """Samples from the global f-ensemble of the experts with SMC (or the local baseline).

    experts: (model, prompt) pairs; f: a name (min, harmonic, product, mixture/sum, quadratic,
    max), an exponent tau, or an Ensemble; weights: expert weights on the simplex (uniform by
    default); level: "token", "byte" or "local"; max_length: in tokens (token levels) or bytes;
    beam_width / prune_threshold: the byte-level beam; prompt_as_bytes: read raw-text prompts
    through the byte beam from BOS (GenLM's convention) instead of tokenizing them canonically;
    resample_finished: False resamples only the particles still extending (not the paper's
    Alg. 1, which resamples all; see `smc_jax.smc.engine`); seed: an int or a PRNG key (same
    seed, same result); mesh / sharding_rules: split the
    particles (and optionally the model weights) over several devices (see `EnsembleSampler`).
    """
    sampler = EnsembleSampler(
        experts=tuple(as_experts(experts)),
        f=f,
        weights=None if weights is None else tuple(float(w) for w in weights),
        level=level,
        num_particles=num_particles,
        ess_threshold=ess_threshold,
        resampler=resampler,
        max_length=max_length,
        temperature=temperature,
        beam_width=beam_width,
        prune_threshold=prune_threshold,
        at_max_length=at_max_length,
        prompt_as_bytes=prompt_as_bytes,
        resample_finished=resample_finished,
        mesh=mesh,
        sharding_rules=sharding_rules,
    )
    return sampler(seed, allow_zero_weight=allow_zero_weight)
