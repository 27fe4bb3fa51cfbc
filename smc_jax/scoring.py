"""Scoring many (prompt, continuation) pairs as byte strings, with a few programs per model.

A sampler built per call would hold the continuation's exact length and the prompt's cache as
constants of its program, so every call would compile anew. A `ByteScorer` instead

* treats prompts and continuations as data. Prompts are prefilled into caches of
  PROMPT_BUCKET * PROMPT_GROWTH^k tokens (`prompt_size`), computed over only the columns that
  hold the prompt (`prompt_columns`: multiples of PREFILL_STEP), and a continuation is read
  CHUNK_BYTES at a time by one program (`_read`), the beams' state carried from run to run, so
  its length does not change the program (only the stores' token capacity does, in powers of
  two from MIN_TOKEN_BUCKET). Compiled per model: a prefill per (batch size, prompt size,
  columns read), a start state and `_read` per (batch size, prompt size, token
  capacity), and capacity scales only grow on an overflow;
* keeps `_read` small: a call site of the model reads its rows ROW_CHUNK at a time
  (`ByteExperts.row_chunk`), so the program holds one forward per call site, and a
  position's next-byte distributions come first in its step, so starting needs no model call;
* scores N pairs at once as N experts of one byte-level group (`ByteExperts` with K = N
  prompts): each byte step's model calls are batched over the pairs; a short last chunk of
  pairs is padded with empty continuations;
* guides the beams along the continuation's own tokenization (`guide`): before reading, one
  call creates the contexts of that tokenization (a chain of up to `guide` tokens) and those one
  token off it that the beams meet on the way (each proper prefix of a chain token that is a
  token itself), GUIDE_CHUNK rows per forward; the reading steps find them in the experts'
  cache (`ByteExperts.guide`) and call the model only for the other tokenizations they keep;
* builds a run's context stores on the last run's buffers when the shape is the same
  (`contexts.Recycled`, donated to the start): the pool and the summary table, (contexts + guide
  slots) x 2V floats, are not zeroed and first touched again on every call;
* compiles a new shape's two programs at once (`_compile`): the start's in a thread, while
  the reading program is traced and compiled (XLA compiles without holding the GIL);
* keeps its two programs on disk (`utils.compilation.stored_jit`, beside the persistent
  compilation cache), so a new process reads them back instead of tracing and lowering them;
* owns its compiled programs (its own `stored_jit`): `scorer_for` keeps at most MAX_SCORERS
  scorers per model (least recently used dropped) in a weak dictionary keyed by the model, so
  programs that can no longer be used are released with their scorer or their model.

Values are those of `byte_logprob` (the same beam, healing included): the batch shares model
calls only, never probabilities.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from smc_jax.bytes.beam import EOS_BYTE
from smc_jax.experts.byte import (
    ByteExperts,
    ByteExpertState,
    ByteLogprob,
    byte_vocabulary,
    guide_rows,
    token_bytes,
    token_ids_of,
)
from smc_jax.models.contexts import ContextStoreOverflowError, Recycled
from smc_jax.models.lm import LanguageModel, Prompt, prefill_columns, prefill_prompts
from smc_jax.settings import CAPACITY_GROWTH, DEFAULTS, MAX_CAPACITY_SCALE, SCORER_CONTEXTS_PER_BEAM_SLOT
from smc_jax.utils.buckets import geometric_bucket
from smc_jax.utils.compilation import stored_jit

#: Bytes read per program run: a continuation is fed CHUNK_BYTES at a time, the beams' state
#: carried from run to run, so one program serves every length.
CHUNK_BYTES = 32
#: The stores hold continuations of up to MIN_TOKEN_BUCKET * 2^k tokens (the least that fits).
MIN_TOKEN_BUCKET = 256
#: Rows per model forward (`ByteExperts.row_chunk`): one forward per call site in the program.
ROW_CHUNK = 1
#: Smallest padded length (bytes) of raw prompt bytes (`prompt_as_bytes`); powers of two above it.
MIN_LENGTH_BUCKET = 16
#: Prompts are padded to PROMPT_BUCKET * PROMPT_GROWTH^k tokens: few sizes, so few programs.
PROMPT_BUCKET, PROMPT_GROWTH = 128, 4
#: Scorers (settings) kept per model; each holds the programs of its buckets.
MAX_SCORERS = 4
#: Pairs scored together by `ByteScorer.batch` by default.
DEFAULT_BATCH = 8
#: Extra contexts per pair for healing (a healed path holds up to 1 + heal_max_backoff).
HEAL_CONTEXTS = 4
#: Guide rows per pair (`ByteScorer(guide=...)`): its tokenization's contexts and those one token off.
GUIDE_ROWS = 256
#: Rows per forward of the guiding call.
GUIDE_CHUNK = 32


def prompt_size(n: int) -> int:
    """The padded size of an n-token prompt: the least PROMPT_BUCKET * PROMPT_GROWTH^k >= n.

    Parameters
    ----------
    n : int
        The prompt's length in tokens.
    """
    return geometric_bucket(n, PROMPT_BUCKET, PROMPT_GROWTH)


def prompt_columns(n: int) -> int:
    """Columns the prefill reads for a longest prompt of n tokens: PROMPT_BUCKET (the smallest
    bucket is one program), or the least multiple of PREFILL_STEP >= n above it
    (`models.lm.prefill_columns`: a larger bucket is a program per multiple).

    Parameters
    ----------
    n : int
        The longest prompt's length in tokens.
    """
    return max(PROMPT_BUCKET, prefill_columns(n))


def _read(
    experts: ByteExperts, state: ByteExpertState, previous: jax.Array, data: jax.Array, offset: jax.Array,
    lengths: jax.Array,
) -> tuple[ByteExpertState, tuple[jax.Array, jax.Array, jax.Array, jax.Array]]:
    """Positions i = offset..offset+C-1 of every pair (one particle, K experts = pairs; data[k]
    holds pair k's bytes there, previous[k] those at i - 1), each one byte step of the
    sampler's (`ByteExperts._advance`: one loop of model calls, one call site): byte i - 1 is
    read where 1 <= i <= length, the next-byte distributions after i bytes are computed where
    i <= length, and at i = length EOS is healed (every string ends, so EOS must be read).
    Returns the state and, per position [C, K]: log p(byte i) by the distribution after i bytes
    (0 from a pair's end on), whether byte i - 1 was healed and then its log-probability (which
    replaces the distribution's 0), and the beams' log mass after the refresh."""
    heal = experts.beam.heal

    def body(state, inputs):
        byte, before, position = inputs  # [K], [K], []
        reading, refresh = (position >= 1) & (position <= lengths), position <= lengths
        state = experts._advance(state, before[None], reading[None], refresh_active=refresh[None],
                                 eos=(position == lengths)[None] if heal else None)
        beams = state.beams
        logp = jnp.take_along_axis(beams.next_logp[0], byte[:, None], axis=1)[:, 0]
        healed = beams.healed[0] & reading
        return state, (jnp.where(position < lengths, logp, 0.0), healed, jnp.where(healed, beams.healed_logp[0], 0.0),
                       beams.log_mass[0])

    return jax.lax.scan(body, state, (data.T, previous.T, offset + jnp.arange(data.shape[1])))


def _start(
    experts: ByteExperts, guide: jax.Array | None, recycle: Recycled
) -> tuple[ByteExpertState, tuple[jax.Array, ...]]:
    """The state after the prompt, guided where `guide` ([3, K, G]: tokens, spine, count) is
    given, and its heals, calls and rows before guiding, its stores built on `recycle`'s
    buffers. Raw prompt bytes are read here (with model calls); a token prompt's start needs
    none (its distributions come at position 0)."""
    state = experts.init(1, refresh=experts.prompt_bytes is not None, recycle=recycle)
    counters = (state.beams.heals, state.stores.calls, state.stores.rows)
    if guide is not None:
        state = experts.guide(state, guide[0], guide[1], guide[2, :, 0], GUIDE_CHUNK)
    return state, counters


def _stores(experts: ByteExperts) -> Recycled:
    """The buffers of a run's context stores (for their shapes: `stored_jit.out_shapes` reads
    them from the store, tracing nothing)."""
    stores = experts.init_stores(1)
    return Recycled(stores.pool, stores.summary)


_store_shapes = stored_jit(_stores)


class ByteScorer:
    """log P(continuation | prompt) under one model read as a byte-level LM, for many pairs.

    `scorer(continuation, prompt)` scores one pair, `scorer.batch(pairs)` many (N = batch_size
    at a time, one vmapped program). Programs are compiled per (N, prompt size, token capacity)
    and reused; `compiled` counts the distinct shapes run so far. The settings are
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
    chunk_bytes : int
        Bytes read per run of the reading program (values do not depend on it).
    guide : int
        Rows of the guiding call per pair (0: off; off for `prompt_as_bytes`). The values are
        the same up to float rounding (a guided context's logits come from a larger batch).
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
        chunk_bytes: int = CHUNK_BYTES,
        guide: int = GUIDE_ROWS,
    ):
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        if guide < 0:
            raise ValueError(f"guide must be >= 0 (0: off), got {guide}")
        settings = DEFAULTS.replace(level="byte", beam_width=beam_width, prune_threshold=prune_threshold,
                                    temperature=temperature, prompt_as_bytes=prompt_as_bytes, heal=heal)  # checks them
        if model.tokenizer is None or not model.tokenizer.eos_token_ids:
            raise ValueError(f"{model.name} needs a tokenizer with an end-of-sequence token to score bytes")
        self.model = model
        self.beam = settings.beam()
        self.temperature = temperature
        self.chunk_bytes = chunk_bytes
        self.prompt_as_bytes = prompt_as_bytes
        self.trie, allowed = byte_vocabulary(model)
        self.allowed = jax.device_put(allowed)
        self.paged = model.paged()  # a Flax model (models.flax_adapter) brings its own
        self.eos = tuple(model.tokenizer.eos_token_ids)
        self.scale = 1
        self.shapes: set[tuple] = set()
        self.guide = 0 if prompt_as_bytes else guide
        if self.guide:
            self.token_bytes, self.ids_of = token_bytes(model), token_ids_of(model)
        # This scorer's own programs, released with it; a chunk's state is updated in place,
        # and the next call of the same shape builds its stores on this one's buffers.
        self._start = stored_jit(_start, donate_argnums=(2,))
        self._read = stored_jit(_read, donate_argnums=(1,))
        self._spare: tuple[tuple, Recycled] | None = None

    def _guide_rows(self, data: bytes) -> tuple[list[int], list[int]]:
        """The guiding call's rows for one continuation (`guide_rows`), along its own tokenization."""
        try:
            chain = self.model.tokenizer.encode(data.decode("utf-8"), add_special_tokens=False)
        except UnicodeDecodeError:  # not text: no tokenization to follow
            return [], []
        return guide_rows(data, chain, self.token_bytes, self.ids_of, self.guide)

    def _recycled(self, experts: ByteExperts, shape: tuple) -> Recycled:
        """The last run's store buffers if it had this shape, else zeros (host-made: no program)."""
        spare, self._spare = self._spare, None  # donated by the start: never passed twice
        if spare is not None and spare[0] == shape:
            return spare[1]
        return jax.tree.map(lambda x: jax.device_put(np.zeros(x.shape, x.dtype)), _store_shapes.out_shapes(experts))

    def _compile(self, experts: ByteExperts, guide, recycle, previous, data, lengths) -> tuple[ByteExpertState, tuple]:
        """The start (`_start`) of a new shape, its program compiled and run in a thread while the
        reading program is traced, lowered and compiled here (XLA compiles without the GIL), so a
        first call waits about for the longer of the two, not for their sum; later calls of
        either program find it compiled. Both programs are kept on disk (`stored_jit`): a new
        process reads them back instead of tracing and lowering them."""
        state = self._start.out_shapes(experts, guide, recycle)[0]
        with ThreadPoolExecutor(1) as pool:
            started = pool.submit(self._start, experts, guide, recycle)
            self._read.precompile(experts, state, previous, data, np.int32(0), lengths)
            return started.result()

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
        max_tokens = geometric_bucket(max_bytes, MIN_TOKEN_BUCKET)
        prompt_bytes = prompt_lengths = None
        if self.prompt_as_bytes:
            if any(not isinstance(p, str) for p in prompts):
                raise ValueError("prompt_as_bytes takes raw-text prompts (chat templates hold control tokens)")
            encoded = [p.encode("utf-8") for p in prompts]
            width = geometric_bucket(max(len(b) for b in encoded), MIN_LENGTH_BUCKET)
            padded = np.zeros((k, width), np.int32)
            for i, b in enumerate(encoded):
                padded[i, : len(b)] = list(b)
            prompt_bytes = jax.device_put(padded)  # a transfer: jnp.asarray compiles a program per shape
            prompt_lengths = jax.device_put(np.array([len(b) for b in encoded], np.int32))
            max_tokens = geometric_bucket(max_bytes + width, MIN_TOKEN_BUCKET)
            ids = [[self.model.tokenizer.bos_token_id]] * k
            if ids[0][0] is None:
                raise ValueError(f"{self.model.name} has no BOS token to start a byte-level prompt from")
        else:
            ids = [self._prompt_ids(p) for p in prompts]
        prefixes, logits = prefill_prompts(self.model, ids, max_tokens, token_ids=True, bucket=prompt_size,
                                           columns=prompt_columns)
        num_contexts = (1 + SCORER_CONTEXTS_PER_BEAM_SLOT * self.beam.width + HEAL_CONTEXTS * self.beam.heal) * scale + self.guide
        num_entries = (2 * (max_tokens + 1) + num_contexts) * scale
        experts = ByteExperts(
            model=self.paged, prefixes=prefixes, prompt_logits=logits, trie=self.trie, allowed=self.allowed,
            eos_ids=self.eos, beam=self.beam, max_tokens=max_tokens, temperature=np.float32(self.temperature),
            num_entries=num_entries, num_contexts=num_contexts, prompt_bytes=prompt_bytes, prompt_lengths=prompt_lengths,
            row_chunk=ROW_CHUNK, guide_slots=self.guide,
        )
        shape = (k, jax.tree.leaves(prefixes)[0].shape, max_tokens, None if prompt_bytes is None else prompt_bytes.shape, scale)
        return experts, shape

    def _chunk(self, pairs: Sequence[tuple[Prompt, bytes]]) -> list[ByteLogprob]:
        datas = [d for _, d in pairs]
        longest = max(len(d) for d in datas)
        width = self.chunk_bytes
        chunks = longest // width + 1  # positions 0..longest: the last refresh is at a pair's length
        data = np.zeros((len(pairs), chunks * width), np.int32)
        for i, d in enumerate(datas):
            data[i, : len(d)] = np.frombuffer(d, np.uint8)
        previous = np.pad(data[:, :-1], ((0, 0), (1, 0)))  # the byte before each position
        lengths = np.asarray([len(d) for d in datas], np.int32)
        guide = None
        if self.guide:
            guide = np.zeros((3, len(pairs), self.guide), np.int32)  # tokens, spine; count in [2, :, 0]
            for i, d in enumerate(datas):
                tokens, spine = self._guide_rows(d)
                guide[0, i, : len(tokens)], guide[1, i, : len(spine)], guide[2, i, 0] = tokens, spine, len(tokens)
        while True:
            experts, shape = self._experts([p for p, _ in pairs], max(1, longest), self.scale)
            recycle = self._recycled(experts, shape)
            if shape in self.shapes:
                state, start = self._start(experts, guide, recycle)
            else:
                state, start = self._compile(experts, guide, recycle, previous[:, :width], data[:, :width], lengths)
            reads = []
            # the prompt's own heals and calls (raw prompt bytes), not the continuation's
            start_heals, start_calls, start_rows = jax.device_get(start)
            for c in range(chunks):  # dispatched without waiting: one sync at the end
                window = slice(c * width, (c + 1) * width)
                state, read = self._read(experts, state, previous[:, window], data[:, window], np.int32(c * width),
                                         lengths)
                reads.append(read)
            self.shapes.add(shape)
            beams = state.beams
            out = jax.device_get((reads[0][3], start_heals, beams.log_mass, beams.next_logp, beams.heals,
                                  state.stores.overflow, reads, (state.stores.calls, state.stores.rows)))
            self._spare = shape, Recycled(state.stores.pool, state.stores.summary)
            if not np.any(out[5]):
                break
            if self.scale >= MAX_CAPACITY_SCALE:
                raise ContextStoreOverflowError("the context store overflowed at its largest scale; shorten the strings")
            self.scale *= CAPACITY_GROWTH  # the store only holds what is alive: no result changes
        # [particle 0] of the beams' arrays, and the log mass after the refresh at position 0
        start_mass, start_heals, log_mass, next_logps, heals = (x[0] for x in out[:5])
        logp, healed, healed_logp, _ = (np.concatenate(parts, axis=0) for parts in zip(*out[6]))  # [chunks * C, K]
        calls, rows = out[7][0] - start_calls, out[7][1] - start_rows  # [K]
        # Byte j's conditional: its healed log-probability, read at position j + 1, where it healed.
        conditionals = np.where(healed[1:], healed_logp[1:], logp[:-1])
        results = []
        for i, d in enumerate(datas):
            prefix = float(log_mass[i] - start_mass[i])
            next_logp = np.asarray(next_logps[i], np.float64)
            results.append(ByteLogprob(
                prefix=prefix, complete=prefix + float(next_logp[EOS_BYTE]),
                conditionals=np.asarray(conditionals[: len(d), i], np.float64),
                next_logprobs=next_logp, healed=int(heals[i] - start_heals[i]), model_calls=int(calls[i]),
                rows=int(rows[i]),
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
