"""Constraint experts: a regular language as a 0/1 potential over strings, as arrays.

A constraint with language L is the potential C(x) = 1{x in L} on complete strings and, for the
sampler's shaping, the prefix potential C^(x) = 1{there is y with xy in L} ("x is viable").
Both are read off a deterministic automaton (DFA):

* `Automaton` (host side, numpy): transitions [S, 256] over bytes, accepting flags [S], a start
  state and one absorbing dead state (the last one). Every other state is viable (an accepting
  state is reachable from it): states from which none is are folded into the dead state when
  the automaton is built, so viability is simply `state != dead`.
* `ConstraintExpert` (device side, a pytree): the same automaton read over an expert alphabet,
  either bytes (alphabet 256, EOS = 256, stackable with `ByteExperts`) or a tokenizer's tokens
  (alphabet V, EOS = V, stackable with `TokenExperts`), whose transition table [S, V] maps state
  s and token v to the state after reading v's bytes (dead if any byte leaves the language).

Its "next-symbol log-probabilities" are the potential's ratios

    log C^(xa) / C^(x) = 0 if a keeps x viable else -inf,     log C(x) / C^(x) for EOS,

which are *not* normalized: the expert is a potential, not a language model (see the contract
in `smc_jax.experts.base`). A sampling step is one gather per particle; no host call.

Memory: a token-level table holds S * V int32 entries (SmolLM2: V = 49152, so 200 KB per state);
`token_transitions` refuses past `max_entries` with the numbers, pointing to the byte level,
whose table is [S, 256] whatever the tokenizer.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from smc_jax.experts.base import take_particles

#: Number of byte values, the alphabet of a byte-level automaton.
NUM_BYTES = 256

#: Default bound on the entries of a token-level transition table (S * V int32 = 512 MB).
MAX_TOKEN_TABLE_ENTRIES = 2**27


class AutomatonTooLargeError(ValueError):
    """An automaton (or its token table) is past the configured size limit."""


def coreachable(successors: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """States from which some state of `targets` is reachable (targets included).

    Args:
        successors: [S, A] int, the state after each symbol.
        targets: [S] bool.

    Returns:
        [S] bool, by a backward breadth-first search on the [S, S] adjacency matrix: one
        scatter of the S * A edges, then O(S^2) work in all (S is bounded by the compiler).
    """
    s = successors.shape[0]
    adjacency = np.zeros((s, s), bool)
    adjacency[np.repeat(np.arange(s), successors.shape[1]), successors.reshape(-1)] = True
    reach = np.asarray(targets, bool).copy()
    frontier = reach.copy()
    while frontier.any():
        frontier = adjacency[:, frontier].any(axis=1) & ~reach
        reach |= frontier
    return reach


#: Distance of states from which no accepting state is reachable (the dead state).
UNREACHABLE = 2**30
#: A horizon no string reaches: the mask of no horizon (None), but as a value, so a sampler that
#: switches between a forced EOS and truncation keeps its program.
NO_HORIZON = int(np.iinfo(np.int32).max)


def distance_to_accept(successors: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """The fewest symbols that lead from each state to an accepting one (UNREACHABLE if none).

    Args:
        successors: [S, A] int, the state after each symbol.
        accepting: [S] bool.

    Returns:
        [S] int32, by a backward breadth-first search on the [S, S] adjacency matrix.
    """
    s = successors.shape[0]
    adjacency = np.zeros((s, s), bool)
    adjacency[np.repeat(np.arange(s), successors.shape[1]), successors.reshape(-1)] = True
    dist = np.full(s, UNREACHABLE, np.int64)
    frontier = np.asarray(accepting, bool).copy()
    dist[frontier] = 0
    d = 0
    while frontier.any():
        d += 1
        frontier = adjacency[:, frontier].any(axis=1) & (dist == UNREACHABLE)
        dist[frontier] = d
    return dist.astype(np.int32)


def minimize(transitions: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The minimal DFA of a normalized one (start 0, every state reachable, dead state last).

    Moore's partition refinement, vectorized: states start in three blocks (accepting, other
    viable, dead) and a block splits while its states disagree on the block reached by some
    byte: label'(s) = rank of (label(s), label(t[s, 0]), ..., label(t[s, 255])). At the fixed
    point two states share a label iff they accept the same suffixes. The DFA a regex compiler
    emits is not minimal (regex-automata does not minimize: a repeated sub-pattern such as
    `W( W)*` yields two copies of W's states), and the token-level table costs V entries per
    state, so this pays for itself at once.

    Args:
        transitions: [S, 256] int, state 0 the start, state S - 1 the absorbing dead state.
        accepting: [S] bool.

    Returns:
        (transitions [S', 256], accepting [S']) with S' <= S, start 0 and the dead state last,
        states numbered in order of their first member.
    """
    s = len(accepting)
    dead = s - 1
    labels = np.where(accepting, 1, 0)
    labels[dead] = 2
    count = len(np.unique(labels))
    while True:
        signature = np.concatenate([labels[:, None], labels[transitions]], axis=1)
        _, labels = np.unique(signature, axis=0, return_inverse=True)
        labels = labels.reshape(-1)
        new_count = int(labels.max()) + 1
        if new_count == count:
            break
        count = new_count
    # Number blocks by their first state: the start (state 0) stays 0 and the dead state, alone
    # in its block (it is the only non-viable state), comes last.
    first = np.full(count, s, np.int64)
    np.minimum.at(first, labels, np.arange(s))
    order = np.argsort(first, kind="stable")
    rank = np.empty(count, np.int64)
    rank[order] = np.arange(count)
    representatives = first[order]
    return rank[labels[transitions[representatives]]], accepting[representatives]


@dataclasses.dataclass(frozen=True, eq=False)
class Automaton:
    """A byte-level DFA whose only non-viable state is the absorbing dead state (the last).

    Attributes:
        transitions: [S, 256] int32, the state after each byte.
        accepting: [S] bool, states where the string read so far is in the language.
        start: the state of the empty string.
        source: what it was compiled from (a regex), for messages.
    """

    transitions: np.ndarray
    accepting: np.ndarray
    start: int
    source: str = ""

    def __repr__(self) -> str:
        return f"Automaton(source={self.source[:60]!r}, states={self.num_states})"

    @property
    def num_states(self) -> int:
        """States including the dead state."""
        return int(self.transitions.shape[0])

    @property
    def dead(self) -> int:
        return self.num_states - 1

    @functools.cached_property
    def digest(self) -> bytes:
        """SHA-256 of the start, accepting flags and transitions: equal automata built apart (the
        same schema compiled per instance) share it, so a batch reads and stores them once."""
        h = hashlib.sha256()
        for array in (np.asarray(self.start, np.int64), np.asarray(self.accepting, bool),
                      np.asarray(self.transitions, np.int64)):
            h.update(np.ascontiguousarray(array).tobytes())
        return h.digest()

    @classmethod
    def from_transitions(
        cls, transitions: np.ndarray, accepting: np.ndarray, start: int, source: str = ""
    ) -> "Automaton":
        """Normalizes any complete byte DFA: folds the states that cannot reach an accepting one
        into a new absorbing dead state (the last) and drops states unreachable from the start.

        Raises:
            ValueError: when the language is empty (the start state is not viable).
        """
        transitions = np.asarray(transitions, np.int64)
        accepting = np.asarray(accepting, bool)
        viable = coreachable(transitions, accepting)
        if not viable[start]:
            raise ValueError(f"the constraint {source!r} matches no string (its language is empty)")
        # States reachable from the start through viable states only.
        reached = np.zeros(len(accepting), bool)
        reached[start] = True
        frontier = [start]
        while frontier:
            nxt = np.unique(transitions[frontier].reshape(-1))
            nxt = nxt[viable[nxt] & ~reached[nxt]]
            reached[nxt] = True
            frontier = nxt.tolist()
        keep = np.flatnonzero(reached)
        keep = np.concatenate([[start], keep[keep != start]])  # the start state becomes 0
        new_id = np.full(len(accepting), len(keep), np.int64)  # everything else: the dead state
        new_id[keep] = np.arange(len(keep))
        table = np.empty((len(keep) + 1, NUM_BYTES), np.int64)
        table[:-1] = new_id[transitions[keep]]
        table[-1] = len(keep)
        acc = np.concatenate([accepting[keep], [False]])
        table, acc = minimize(table, acc)
        return cls(transitions=table.astype(np.int32), accepting=acc, start=0, source=source)

    # ------------------------------------------------------------------ host-side reference

    def walk(self, data: bytes, state: int | None = None) -> int:
        """The state after reading `data` (host side)."""
        s = self.start if state is None else state
        for b in data:
            s = int(self.transitions[s, b])
        return s

    def matches(self, data: bytes | str) -> bool:
        """Whether the complete string is in the language."""
        data = data.encode("utf-8") if isinstance(data, str) else data
        return bool(self.accepting[self.walk(data)])

    def viable(self, data: bytes | str) -> bool:
        """Whether the prefix can still be completed to a string of the language."""
        data = data.encode("utf-8") if isinstance(data, str) else data
        return self.walk(data) != self.dead

    # ------------------------------------------------------------------ experts

    def byte_expert(self, horizon: int | None = None) -> "ConstraintExpert":
        """The constraint over bytes (alphabet 256, EOS = 256), stackable with byte experts.
        `horizon`: see `ConstraintExpert`."""
        return ConstraintExpert.build(self.transitions, self.accepting, NUM_BYTES, horizon)

    def token_expert(
        self, byte_strings: Sequence[bytes | None], horizon: int | None = None,
        max_entries: int = MAX_TOKEN_TABLE_ENTRIES,
    ) -> "ConstraintExpert":
        """The constraint over a vocabulary whose token v spells `byte_strings[v]` (None: a control
        token, never allowed), EOS = len(byte_strings). See `token_transitions`."""
        key = _table_key(self, byte_strings, max_entries)
        arrays = _TOKEN_TABLES.pop(key, None)
        if arrays is None:
            arrays = device_tables(*token_transitions(self, byte_strings, max_entries))
        _TOKEN_TABLES[key] = arrays  # most recently used last
        while len(_TOKEN_TABLES) > 1 and sum(a.nbytes for t in _TOKEN_TABLES.values() for a in t) > TOKEN_TABLE_CACHE_BYTES:
            _TOKEN_TABLES.popitem(last=False)
        return ConstraintExpert.from_tables(*arrays, alphabet_size=len(byte_strings), horizon=horizon)

    def symbol_expert(self, alphabet: str, horizon: int | None = None) -> "ConstraintExpert":
        """The constraint over a toy alphabet: symbol i is the UTF-8 text `alphabet[i]`."""
        return self.token_expert([c.encode("utf-8") for c in alphabet], horizon)


#: Host bytes of token-level tables kept for the most recently used (automaton, vocabulary)
#: pairs (the newest is kept whatever its size). Building one costs a second or more (S x the
#: vocabulary's total bytes of gathers, then two [S, S] reachability passes); a study builds a
#: sampler per instance and method from equal automata (the text-to-SQL questions all share
#: one), and a batch of problems reads all of its instances' automata on every call (twenty
#: JSON schemas over SmolLM2's vocabulary hold about 1 GB).
TOKEN_TABLE_CACHE_BYTES = 2 << 30
_TOKEN_TABLES: OrderedDict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()


def _table_key(automaton: Automaton, byte_strings: Sequence[bytes | None], max_entries: int) -> bytes:
    """A digest of the automaton's arrays, the token spellings and the size bound."""
    return hashlib.sha256(automaton.digest + int(max_entries).to_bytes(8, "little")
                          + _vocabulary_digest(tuple(byte_strings))).digest()


@functools.lru_cache(maxsize=4)
def _vocabulary_digest(byte_strings: tuple[bytes | None, ...]) -> bytes:
    """A digest of the token spellings, kept: a sampler reads each automaton of a batch over one
    vocabulary, whose digest costs a Python pass over its tokens (25 ms for SmolLM2's)."""
    h = hashlib.sha256()
    for b in byte_strings:
        h.update(b"\x00" if b is None else b"\x01" + len(b).to_bytes(4, "little") + b)
    return h.digest()


def token_transitions(
    automaton: Automaton, byte_strings: Sequence[bytes | None], max_entries: int = MAX_TOKEN_TABLE_ENTRIES
) -> tuple[np.ndarray, np.ndarray]:
    """The automaton read through tokens: table[s, v] = the state after v's bytes from s.

    table[s, v] is the dead state when a byte of v leads there (the token leaves the language)
    or v has no bytes (None). Tokens are sorted by length and processed a byte position at a
    time, so the cost is S * (total bytes of the vocabulary) gathers, with no Python loop over
    tokens. A state from which no *token* path reaches an accepting state (possible when some
    bytes are no token's spelling) is folded into the dead state too, so that the token-level
    prefix potential is exactly "completable with these tokens".

    Args:
        automaton: a normalized byte automaton.
        byte_strings: the V tokens' byte strings.
        max_entries: refuse when S * V exceeds this.

    Returns:
        (table [S, V] int32, accepting [S] bool), with the same dead state as the automaton.

    Raises:
        AutomatonTooLargeError: S * V > max_entries.
    """
    s, v = automaton.num_states, len(byte_strings)
    if s * v > max_entries:
        raise AutomatonTooLargeError(
            f"the token-level table of {automaton.source!r} would hold {s} states x {v} tokens = "
            f"{s * v:,} entries, more than max_entries={max_entries:,}; use the byte level "
            "(level='byte'), whose table is [states, 256], or a smaller pattern/schema"
        )
    dead = automaton.dead
    lengths = np.array([-1 if b is None else len(b) for b in byte_strings], np.int64)
    order = np.argsort(-lengths, kind="stable")
    longest = max(int(lengths.max(initial=0)), 0)
    padded = np.zeros((v, max(longest, 1)), np.int32)
    for i, token in enumerate(order):
        b = byte_strings[token]
        if b:
            padded[i, : len(b)] = np.frombuffer(b, np.uint8)
    sorted_lengths = lengths[order]
    width = automaton.transitions.shape[1]
    # States as row offsets into the flat table (state * 256): one flat gather per byte position.
    index = np.int32 if s * width < np.iinfo(np.int32).max else np.int64
    rows = (automaton.transitions.astype(index) * width).reshape(-1)
    cur = np.repeat(np.arange(s, dtype=index)[:, None] * width, v, axis=1)
    for j in range(longest):
        n = int(np.sum(sorted_lengths > j))  # tokens longer than j come first
        cur[:, :n] = np.take(rows, cur[:, :n] + padded[None, :n, j])
    cur //= width
    cur[:, sorted_lengths < 0] = dead
    table = np.empty((s, v), np.int32)
    table[:, order] = cur
    table[dead] = dead
    viable = coreachable(table, automaton.accepting)
    viable[dead] = False
    if not viable[automaton.start]:
        raise ValueError(f"no sequence of these tokens spells a string matching {automaton.source!r}")
    table = np.where(viable[table], table, dead).astype(np.int32)
    return table, automaton.accepting.copy()


#: Fewest states of a padded automaton (`pad_states`).
MIN_STATE_BUCKET = 16


def state_bucket(num_states: int) -> int:
    """The padded state count: the next power of two >= num_states (at least MIN_STATE_BUCKET).

    Parameters
    ----------
    num_states : int
        S, the automaton's states (dead state included).
    """
    return max(MIN_STATE_BUCKET, 1 << (num_states - 1).bit_length())


def pad_states(transitions: np.ndarray, accepting: np.ndarray, size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The automaton with unreachable, non-accepting states inserted before the dead state (still
    the last) up to `state_bucket` states, so automata of similar sizes give arrays of one shape and
    share a compiled sampler (as prompts share a prompt bucket). The language is unchanged: the
    new states lead only to the dead state, and no state leads to them.

    Parameters
    ----------
    transitions : numpy.ndarray, shape [S, A]
        The next state of every state and symbol; S - 1 is the dead state.
    accepting : numpy.ndarray, shape [S]
        Accepting flags.
    size : int, optional
        P, at least S (default `state_bucket(S)`).

    Returns
    -------
    tuple of numpy.ndarray
        The [P, A] table and [P] flags, dead state P - 1.
    """
    s = transitions.shape[0]
    p = state_bucket(s) if size is None else size
    if p < s:
        raise ValueError(f"cannot pad {s} states down to {p}")
    if p == s:
        return transitions, accepting
    table = np.full((p, transitions.shape[1]), p - 1, transitions.dtype)
    table[: s - 1] = np.where(transitions[: s - 1] == s - 1, p - 1, transitions[: s - 1])
    flags = np.zeros((p,), bool)
    flags[: s - 1] = accepting[: s - 1]
    return table, flags


def device_tables(transitions: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The padded table and flags (`pad_states`) and each state's distance to acceptance
    (`distance_to_accept`): what a `ConstraintExpert` holds, read-only (they may be shared)."""
    transitions, accepting = pad_states(transitions, accepting)
    arrays = (transitions, accepting, distance_to_accept(transitions, accepting))
    for array in arrays:
        array.setflags(write=False)
    return arrays


class ConstraintState(NamedTuple):
    state: Int[Array, "M"]  # automaton state
    length: Int[Array, "M"]  # symbols read (for the horizon)


@struct.dataclass
class ConstraintExpert:
    """A 0/1 potential from an automaton over an expert alphabet (bytes or tokens).

    State: each particle's automaton state and length. `logprobs` gives 0 for the symbols that
    keep the string viable and -inf for the others, 0 for EOS in accepting states and -inf
    elsewhere: log C^(xa) - log C^(x) and log C(x) - log C^(x). Not normalized (a potential).

    With a `horizon` L (the sampler's max_length under a forced EOS), viability is
    length-aware: C^_L(x) = 1{some y with len(xy) <= L has xy in L}, i.e. a symbol is allowed only
    when the fewest symbols from its state to acceptance (`distance`) fit in what remains. The
    target, f(p(x)) C(x) on strings of length <= L, is unchanged; particles are no longer
    steered into structures they cannot close before the limit (where they would die).

    Parameters
    ----------
    transitions : jax.Array, shape [S, A]
        The next automaton state of every state and symbol (the dead state absorbs).
    accepting : jax.Array, shape [S]
        Whether a state accepts (EOS allowed).
    distance : jax.Array, shape [S]
        The fewest symbols from a state to an accepting one (large for the dead state).
    alphabet_size : int
        A: 256 bytes, or a model's vocabulary size.
    horizon : int, optional
        L for length-aware viability (None: no length limit).
    num_experts : int
        Always 1: one constraint per expert group.
    start : jax.Array, optional
        The start state: None for state 0 (an `Automaton`'s start), else the first state of this
        automaton's block in a table shared by a batch's problems (`merge_constraints`).
    """

    transitions: Int[Array, "S A"]
    accepting: Bool[Array, "S"]
    distance: Int[Array, "S"]
    alphabet_size: int = struct.field(pytree_node=False)
    horizon: Int[Array, ""] | None = None  # a run-time value: a new max_length reuses the program
    num_experts: int = struct.field(pytree_node=False, default=1)
    start: Int[Array, ""] | None = None  # None: state 0; else this automaton's block (`merge_constraints`)

    #: Marks a potential whose rows are not distributions (see `smc_jax.experts.base`).
    is_potential = True

    @classmethod
    def build(cls, transitions: np.ndarray, accepting: np.ndarray, alphabet_size: int, horizon: int | None = None,
              pad: bool = True):
        if pad:
            transitions, accepting = pad_states(transitions, accepting)
        return cls.from_tables(transitions, accepting, distance_to_accept(transitions, accepting),
                               alphabet_size=alphabet_size, horizon=horizon)

    @classmethod
    def from_tables(cls, transitions: np.ndarray, accepting: np.ndarray, distance: np.ndarray, *,
                    alphabet_size: int, horizon: int | None = None) -> "ConstraintExpert":
        """The expert of host tables (`device_tables`) and a horizon."""
        if horizon is not None and horizon < 0:
            raise ValueError(f"horizon must be >= 0 or None, got {horizon}")
        return cls(
            transitions=jnp.asarray(transitions, jnp.int32), accepting=jnp.asarray(accepting),
            distance=jnp.asarray(distance), alphabet_size=alphabet_size,
            horizon=None if horizon is None else np.int32(horizon),
        )

    @property
    def num_states(self) -> int:
        return int(self.transitions.shape[0])

    @property
    def dead(self) -> int:
        return self.num_states - 1

    def init(self, num_particles: int) -> ConstraintState:
        zeros = jnp.zeros((num_particles,), jnp.int32)
        start = zeros if self.start is None else zeros + self.start  # state 0 is an Automaton's start
        return ConstraintState(state=start, length=zeros)

    def logprobs(self, state: ConstraintState) -> Float[Array, "M 1 A1"]:
        nxt = self.transitions[state.state]  # [M, A]
        ok = nxt != self.dead
        if self.horizon is not None:
            ok &= self.distance[nxt] <= (self.horizon - state.length - 1)[:, None]
        sym = jnp.where(ok, 0.0, -jnp.inf)
        eos = jnp.where(self.accepting[state.state], 0.0, -jnp.inf)
        return jnp.concatenate([sym, eos[:, None]], axis=-1).astype(jnp.float32)[:, None, :]

    def advance(self, state: ConstraintState, symbols: Int[Array, "M"], active: Bool[Array, "M"]) -> ConstraintState:
        sym = jnp.clip(symbols, 0, self.alphabet_size - 1)
        return ConstraintState(
            state=jnp.where(active, self.transitions[state.state, sym], state.state),
            length=state.length + active.astype(jnp.int32),
        )

    def reorder(self, state: ConstraintState, ancestors: Int[Array, "M"]) -> ConstraintState:
        return take_particles(state, ancestors)


def merge_constraints(experts: Sequence[ConstraintExpert], num_states: int | None = None) -> list[ConstraintExpert]:
    """Each expert as a view of one table holding every distinct automaton among `experts`:
    automaton d's live states are rows o_d .. o_d + S_d - 2, the dead states fold into one (the
    last row), and the view starts at o_d. A view's potential is its automaton's, state for state
    (the states are relabelled, nothing else), so a batch of problems with different automata
    shares one table, passed once, where stacking them would copy a [P, V] table per problem.
    The table is padded to `num_states` rows (one shape for several batches).

    Parameters
    ----------
    experts : sequence of ConstraintExpert
        Over one alphabet; the same object may repeat (it is stored once).
    num_states : int, optional
        Rows of the table, at least the automata's live states plus one (`merged_states` bounds
        it). Default: `state_bucket` of that, and the experts themselves when there is one
        distinct automaton. One distinct automaton whose table has `num_states` rows already
        is not copied (its views start at 0).

    Returns
    -------
    list of ConstraintExpert
        One view per expert, in order.
    """
    distinct = list({id(e): e for e in experts}.values())
    if len({e.alphabet_size for e in distinct}) > 1:
        raise ValueError("constraints over different alphabets cannot share a table; give every problem "
                         "automata read over the same vocabulary")
    if len(distinct) == 1 and num_states in (None, distinct[0].num_states):
        if num_states is None:
            return list(experts)
        # already one table of that size (`pad_states` pads to `state_bucket` too): views, not a copy
        return [e.replace(start=np.int32(0) if e.start is None else e.start) for e in experts]
    sizes = [_live_states(e) for e in distinct]  # the dead state is shared, the bucket's padding dropped
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    total = state_bucket(int(offsets[-1]) + 1) if num_states is None else num_states
    if total < offsets[-1] + 1:
        raise ValueError(f"num_states={num_states} cannot hold these automata's {offsets[-1] + 1} states")
    dead = total - 1
    # Written in place, block by block (a whole-table fill and np.where's temporaries touched
    # every page of a table of hundreds of MB several times over).
    table = np.empty((total, distinct[0].alphabet_size), np.int32)
    table[offsets[-1]:] = dead
    accepting = np.zeros((total,), bool)
    distance = np.full((total,), max(int(e.distance[-1]) for e in distinct), np.int32)
    for e, o, s in zip(distinct, offsets, sizes):
        block, rows = np.asarray(e.transitions)[:s], table[o: o + s]
        np.add(block, o, out=rows)
        np.putmask(rows, block == e.dead, dead)
        accepting[o: o + s] = np.asarray(e.accepting)[:s]
        distance[o: o + s] = np.asarray(e.distance)[:s]
    shared = ConstraintExpert.from_tables(table, accepting, distance, alphabet_size=distinct[0].alphabet_size)
    start = {id(e): np.int32(o) for e, o in zip(distinct, offsets)}
    return [shared.replace(horizon=e.horizon, start=start[id(e)]) for e in experts]


def merged_states(automata: Sequence[Automaton]) -> int:
    """The rows `merge_constraints` needs at most for experts of these distinct automata (read
    at any level: a token-level table has its byte automaton's states), as a `state_bucket`;
    equal automata (`Automaton.digest`) count once."""
    distinct = {a.digest: a for a in automata}.values()
    return state_bucket(sum(a.num_states - 1 for a in distinct) + 1)


def _live_states(expert: ConstraintExpert) -> int:
    """The states before the padding (`pad_states`): a padding state only leads to the dead
    state and does not accept (a real such state would have folded into the dead one)."""
    table, accepting = np.asarray(expert.transitions)[:-1], np.asarray(expert.accepting)[:-1]
    real = np.flatnonzero(accepting | (table != expert.dead).any(axis=1))
    return int(real[-1]) + 1 if real.size else 1
