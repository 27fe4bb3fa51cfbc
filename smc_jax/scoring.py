"""Scoring many (prompt, continuation) pairs as byte strings, compiled once per length bucket.

A sampler built per call would hold the continuation's exact length and the prompt's cache as
constants of its program, so every call would compile anew (15-21 s and ~3,000 new memory
mappings each on CPU). A `ByteScorer` instead

* treats prompts and continuations as data: prompt caches are prefilled into padded buckets
  (`prompt_bucket`) and continuations padded to a power-of-two number of bytes (at least
  MIN_LENGTH_BUCKET), so one program serves every pair of the same (batch, prompt bucket,
  length bucket); the programs compiled are at most #length buckets x #prompt buckets x
  #batch sizes (x capacity scales, which only grow on a context-store overflow);
* scores N pairs at once as N experts of one byte-level group (`ByteExperts` with K = N
  prompts): one `lax.scan` over bytes, each byte step one model call batched over the pairs;
  a short last chunk is padded with empty continuations;
* owns its compiled programs (its own `jax.jit`): `scorer_for` keeps at most MAX_SCORERS
  scorers per model (least recently used dropped) in a weak dictionary keyed by the model, so
  programs that can no longer be used are released with their scorer or their model.

Values are those of `byte_logprob` (the same beam, healing included): the batch shares model
calls only, never probabilities.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from smc_jax.bytes.beam import EOS_BYTE
from smc_jax.experts.byte import ByteExperts, ByteLogprob, byte_vocabulary
from smc_jax.models.contexts import ContextStoreOverflowError
from smc_jax.models.lm import LanguageModel, Prompt, prefill_prompts
from smc_jax.settings import CAPACITY_GROWTH, CONTEXTS_PER_BEAM_SLOT, DEFAULTS, MAX_CAPACITY_SCALE

#: Smallest padded continuation length (bytes); lengths are padded to powers of two above it.
MIN_LENGTH_BUCKET = 16
#: Scorers (settings) kept per model; each holds the programs of its buckets.
MAX_SCORERS = 4
#: Pairs scored together by `ByteScorer.batch` by default.
DEFAULT_BATCH = 8
#: Extra contexts per pair for healing (a healed path holds up to 1 + heal_max_backoff).
HEAL_CONTEXTS = 4


def length_bucket(n: int, smallest: int = MIN_LENGTH_BUCKET) -> int:
    """The padded length of an n-byte continuation: the least smallest * 2^k >= n.

    Parameters
    ----------
    n : int
        The continuation's length in bytes.
    smallest : int
        The smallest bucket.
    """
    size = smallest
    while size < n:
        size *= 2
    return size


class _Scored(NamedTuple):
    start_log_mass: jax.Array  # [K]
    log_mass: jax.Array  # [K]
    next_logp: jax.Array  # [K, 257]
    conditionals: jax.Array  # [T, K]
    heals: jax.Array  # [K]
    overflow: jax.Array  # [K]


def _score(experts: ByteExperts, data: jax.Array, lengths: jax.Array) -> _Scored:
    """Feeds data[k, :lengths[k]] to expert k's beam (one particle): the scan of `byte_logprob`,
    batched over the K experts (pairs)."""
    state = experts.init(1)
    start = state.beams

    def body(state, inputs):
        byte, position = inputs  # [K]
        active = (position < lengths)[None]
        logp = jnp.take_along_axis(state.beams.next_logp[0], byte[:, None], axis=1)[:, 0]
        state = experts._advance(state, byte[None], active)
        logp = jnp.where(state.beams.healed[0], state.beams.healed_logp[0], logp)
        return state, jnp.where(active[0], logp, 0.0)

    final, cond = jax.lax.scan(body, state, (data.T, jnp.arange(data.shape[1])))
    final = experts.heal_eos(final, jnp.ones((1,), bool))  # every string ends: EOS must be read
    return _Scored(
        start_log_mass=start.log_mass[0],
        log_mass=final.beams.log_mass[0],
        next_logp=final.beams.next_logp[0],
        conditionals=cond,
        heals=final.beams.heals[0] - start.heals[0],
        overflow=final.stores.overflow,
    )


class ByteScorer:
    """log P(continuation | prompt) under one model read as a byte-level LM, for many pairs.

    `scorer(continuation, prompt)` scores one pair, `scorer.batch(pairs)` many (N = batch_size
    at a time, one vmapped program). Programs are compiled per (N, prompt bucket, length
    bucket) and reused; `compiled` counts the distinct shapes run so far. The settings are
    checked by `smc_jax.settings.SamplerSettings` (defaults: its `DEFAULTS`).

    Parameters
    ----------
    model : LanguageModel
        The model read as a byte-level LM (it needs a tokenizer with an EOS token).
    beam_width : int
        Beam width B of the beam over tokenizations.
    prune_threshold : float
        Relative pruning threshold (0: no pruning).
    temperature : float
        Divides the model's logits.
    prompt_as_bytes : bool
        Read raw-text prompts through the byte beam from BOS (GenLM's convention).
    heal : bool
        Token healing when a byte empties the beam (`smc_jax.bytes.healing`).
    """

    def __init__(
        self,
        model: LanguageModel,
        *,
        beam_width: int = DEFAULTS.beam_width,
        prune_threshold: float = DEFAULTS.prune_threshold,
        temperature: float = DEFAULTS.temperature,
        prompt_as_bytes: bool = DEFAULTS.prompt_as_bytes,
        heal: bool = DEFAULTS.heal,
    ):
        settings = DEFAULTS.replace(level="byte", beam_width=beam_width, prune_threshold=prune_threshold,
                                    temperature=temperature, prompt_as_bytes=prompt_as_bytes, heal=heal)  # checks them
        if model.tokenizer is None or not model.tokenizer.eos_token_ids:
            raise ValueError(f"{model.name} needs a tokenizer with an end-of-sequence token to score bytes")
        self.model = model
        self.beam = settings.beam()
        self.temperature = temperature
        self.prompt_as_bytes = prompt_as_bytes
        self.trie, allowed = byte_vocabulary(model)
        self.allowed = jnp.asarray(allowed)
        self.paged = model.paged()  # a Flax model (models.flax_adapter) brings its own
        self.eos = tuple(model.tokenizer.eos_token_ids)
        self.scale = 1
        self.shapes: set[tuple] = set()
        self._run = jax.jit(_score)  # this scorer's own programs: released with it

    @property
    def compiled(self) -> int:
        return len(self.shapes)

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        ids = self.model.encode_prompt(prompt)
        if not ids:  # no prompt: condition on BOS alone
            bos = self.model.tokenizer.bos_token_id
            if bos is None:
                raise ValueError(f"{self.model.name} has no BOS token to score without a prompt; give a prompt")
            ids = [bos]
        return ids

    def _experts(self, prompts: Sequence[Prompt], max_bytes: int, scale: int) -> tuple[ByteExperts, tuple]:
        k = len(prompts)
        length = length_bucket(max_bytes)
        prompt_bytes = prompt_lengths = None
        if self.prompt_as_bytes:
            if any(not isinstance(p, str) for p in prompts):
                raise ValueError("prompt_as_bytes takes raw-text prompts (chat templates hold control tokens)")
            encoded = [p.encode("utf-8") for p in prompts]
            width = length_bucket(max(len(b) for b in encoded))
            padded = np.zeros((k, width), np.int32)
            for i, b in enumerate(encoded):
                padded[i, : len(b)] = list(b)
            prompt_bytes, prompt_lengths = jnp.asarray(padded), jnp.asarray([len(b) for b in encoded], jnp.int32)
            max_tokens = length + width
            ids = [[self.model.tokenizer.bos_token_id]] * k
            if ids[0][0] is None:
                raise ValueError(f"{self.model.name} has no BOS token to start a byte-level prompt from")
        else:
            max_tokens = length
            ids = [self._prompt_ids(p) for p in prompts]
        prefixes, logits = prefill_prompts(self.model, ids, max_tokens, token_ids=True)
        num_contexts = (1 + CONTEXTS_PER_BEAM_SLOT * self.beam.width + HEAL_CONTEXTS * self.beam.heal) * scale
        num_entries = (2 * (max_tokens + 1) + num_contexts) * scale
        experts = ByteExperts(
            model=self.paged, prefixes=prefixes, prompt_logits=logits, trie=self.trie, allowed=self.allowed,
            eos_ids=self.eos, beam=self.beam, max_tokens=max_tokens, temperature=np.float32(self.temperature),
            num_entries=num_entries, num_contexts=num_contexts, prompt_bytes=prompt_bytes, prompt_lengths=prompt_lengths,
        )
        shape = (k, jax.tree.leaves(prefixes)[0].shape, length, None if prompt_bytes is None else prompt_bytes.shape, scale)
        return experts, shape

    def _chunk(self, pairs: Sequence[tuple[Prompt, bytes]]) -> list[ByteLogprob]:
        datas = [d for _, d in pairs]
        max_bytes = max(1, max(len(d) for d in datas))
        while True:
            experts, shape = self._experts([p for p, _ in pairs], max_bytes, self.scale)
            data = np.zeros((len(pairs), length_bucket(max_bytes)), np.int32)
            for i, d in enumerate(datas):
                data[i, : len(d)] = np.frombuffer(d, np.uint8)
            out = jax.device_get(self._run(experts, jnp.asarray(data), jnp.asarray([len(d) for d in datas], jnp.int32)))
            self.shapes.add(shape)
            if not np.any(out.overflow):
                break
            if self.scale >= MAX_CAPACITY_SCALE:
                raise ContextStoreOverflowError("the context store overflowed at its largest scale; shorten the strings")
            self.scale *= CAPACITY_GROWTH  # the store only holds what is alive: no result changes
        results = []
        for i, d in enumerate(datas):
            prefix = float(out.log_mass[i] - out.start_log_mass[i])
            next_logp = np.asarray(out.next_logp[i], np.float64)
            results.append(ByteLogprob(
                prefix=prefix, complete=prefix + float(next_logp[EOS_BYTE]),
                conditionals=np.asarray(out.conditionals[: len(d), i], np.float64),
                next_logprobs=next_logp, healed=int(out.heals[i]),
            ))
        return results

    def __call__(self, continuation: str | bytes, prompt: Prompt = "") -> ByteLogprob:
        """Scores one pair (see `smc_jax.logprob`).

        Parameters
        ----------
        continuation : str or bytes
            The scored string (UTF-8 when a str).
        prompt : str or list of dict
            Raw text or chat messages before it ("" for none).
        """
        return self._chunk([(prompt, _as_bytes(continuation))])[0]

    def batch(self, pairs: Sequence[tuple[Prompt, str | bytes]], batch_size: int = DEFAULT_BATCH) -> list[ByteLogprob]:
        """Scores (prompt, continuation) pairs, `batch_size` at a time (pairs sorted by length
        so that a chunk's length bucket fits its pairs; results in the input order).

        Parameters
        ----------
        pairs : sequence of (prompt, continuation)
            Prompts (raw text or chat messages) and the strings scored after them.
        batch_size : int
            Pairs per program run (a short last chunk is padded with empty continuations).

        Returns
        -------
        list of ByteLogprob
            One per pair, in the input order.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        items = [(p, _as_bytes(c)) for p, c in pairs]
        order = sorted(range(len(items)), key=lambda i: len(items[i][1]))
        results: list[ByteLogprob | None] = [None] * len(items)
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            chunk = [items[i] for i in index]
            chunk += [(chunk[0][0], b"")] * (batch_size - len(chunk))  # fixed K: pad with empty strings
            for i, result in zip(index, self._chunk(chunk)):
                results[i] = result
        return results


def _as_bytes(continuation: str | bytes) -> bytes:
    if isinstance(continuation, str):
        return continuation.encode("utf-8")
    if isinstance(continuation, (bytes, bytearray)):
        return bytes(continuation)
    raise TypeError(f"a continuation is str or bytes, got {type(continuation).__name__}")


_SCORERS: "weakref.WeakKeyDictionary[LanguageModel, OrderedDict]" = weakref.WeakKeyDictionary()


def scorer_for(model: LanguageModel, **settings) -> ByteScorer:
    """The model's cached scorer for these settings (built on first use; at most MAX_SCORERS
    per model, the least recently used dropped with its programs).

    Parameters
    ----------
    model : LanguageModel
        The model that scores.
    **settings
        `ByteScorer`'s keyword arguments (beam width, prune threshold, temperature, ...).
    """
    cache = _SCORERS.setdefault(model, OrderedDict())
    key = tuple(sorted(settings.items()))
    if key in cache:
        cache.move_to_end(key)
    else:
        cache[key] = ByteScorer(model, **settings)
        while len(cache) > MAX_SCORERS:
            cache.popitem(last=False)
    return cache[key]


def logprob_batch(
    model: LanguageModel,
    pairs: Sequence[tuple[Prompt, str | bytes]],
    *,
    batch_size: int = DEFAULT_BATCH,
    beam_width: int = DEFAULTS.beam_width,
    prune_threshold: float = DEFAULTS.prune_threshold,
    temperature: float = DEFAULTS.temperature,
    prompt_as_bytes: bool = DEFAULTS.prompt_as_bytes,
    heal: bool = DEFAULTS.heal,
) -> list[ByteLogprob]:
    """`smc_jax.logprob` of many (prompt, continuation) pairs, `batch_size` per program run.

    Parameters
    ----------
    model : LanguageModel
        The model read as a byte-level LM.
    pairs : sequence of (prompt, continuation)
        Prompts (raw text or chat messages) and the strings scored after them.
    batch_size : int
        Pairs per program run.
    beam_width : int
        Beam width B of the beam over tokenizations.
    prune_threshold : float
        Relative pruning threshold (0: no pruning).
    temperature : float
        Divides the model's logits.
    prompt_as_bytes : bool
        Read raw-text prompts through the byte beam from BOS (GenLM's convention).
    heal : bool
        Token healing when a byte empties the beam (`smc_jax.bytes.healing`).

    Returns
    -------
    list of ByteLogprob
        One per pair, in the input order (`.healed`: bytes healed).
    """
    scorer = scorer_for(model, beam_width=beam_width, prune_threshold=prune_threshold, temperature=temperature,
                        prompt_as_bytes=prompt_as_bytes, heal=heal)
    return scorer.batch(pairs, batch_size=batch_size)
