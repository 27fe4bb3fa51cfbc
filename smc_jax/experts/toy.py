"""Toy experts whose distributions can be enumerated exactly: the ground truth for tests.

* `TableExpert`: an explicit table of string probabilities (finite support). Its prefix trie
  gives exact next-symbol conditionals p(a | x) = P(xa) / P(x) and p(EOS | x) = p(x) / P(x).
* `NGramExpert`: an n-gram table of next-symbol distributions with EOS (infinite support,
  geometric lengths); exact probabilities of all strings up to a length are enumerable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from smc_jax.experts.base import eos_symbol, take_particles

#: Tolerance on the total probability of a table expert.
TABLE_SUM_TOLERANCE = 1e-6


def _as_sequence(string: str | Sequence[int], alphabet: str | None, alphabet_size: int) -> tuple[int, ...]:
    if isinstance(string, str):
        if alphabet is None:
            raise ValueError("string keys need an `alphabet` (a string listing the symbols)")
        unknown = set(string) - set(alphabet)
        if unknown:
            raise ValueError(f"symbols {sorted(unknown)} of {string!r} are not in the alphabet {alphabet!r}")
        return tuple(alphabet.index(c) for c in string)
    seq = tuple(int(s) for s in string)
    if any(not 0 <= s < alphabet_size for s in seq):
        raise ValueError(f"sequence {seq} has symbols outside 0..{alphabet_size - 1}")
    return seq


@struct.dataclass
class TableExpert:
    """One expert with an explicit finite table of string probabilities.

    State: the trie node of each particle's prefix (a dead node once the prefix leaves the
    support; every next-symbol log-probability there is -inf).

    Attributes
    ----------
    next_logprobs : jax.Array, shape [N + 1, A + 1]
        log p(a | node) for every trie node of the table's prefixes (the last row: the dead node).
    children : jax.Array, shape [N + 1, A]
        The child node of each node and symbol (the dead node where the prefix leaves the support).
    alphabet_size : int
        A.
    num_experts : int
        1.
    """

    next_logprobs: Float[Array, "N1 A1"]  # per trie node (+ dead node), log p(a | prefix)
    children: Int[Array, "N1 A"]  # child node per symbol (dead node if absent)
    alphabet_size: int = struct.field(pytree_node=False)
    num_experts: int = struct.field(pytree_node=False, default=1)

    @classmethod
    def from_table(
        cls,
        table: Mapping[str | Sequence[int], float],
        alphabet_size: int | None = None,
        alphabet: str | None = None,
    ) -> "TableExpert":
        """`table` maps strings (over `alphabet`) or integer sequences to probabilities that sum
        to 1. Zero entries are allowed and mean the string is not in the support.

        Parameters
        ----------
        table : mapping
            Strings over `alphabet` (or integer sequences) -> probabilities summing to 1.
        alphabet_size : int, optional
            A; inferred from `alphabet` or the sequences when None.
        alphabet : str, optional
            The characters of the symbols 0..A-1 when the keys are strings.
        """
        if alphabet is not None:
            alphabet_size = len(alphabet)
        if alphabet_size is None or alphabet_size < 1:
            raise ValueError("give alphabet_size (>= 1) or an alphabet string")
        probs: dict[tuple[int, ...], float] = {}
        for string, p in table.items():
            seq = _as_sequence(string, alphabet, alphabet_size)
            if not (np.isfinite(p) and p >= 0):
                raise ValueError(f"probability of {string!r} must be finite and >= 0, got {p}")
            probs[seq] = probs.get(seq, 0.0) + float(p)
        total = sum(probs.values())
        if abs(total - 1.0) > TABLE_SUM_TOLERANCE:
            raise ValueError(f"table probabilities must sum to 1, got {total:.8g}")

        nodes: dict[tuple[int, ...], int] = {(): 0}
        for seq in probs:
            for t in range(1, len(seq) + 1):
                nodes.setdefault(seq[:t], len(nodes))
        n = len(nodes)
        dead = n
        mass = np.zeros(n + 1)  # prefix probability P(node)
        end = np.zeros(n + 1)  # complete-string probability p(node)
        for seq, p in probs.items():
            end[nodes[seq]] += p
            for t in range(len(seq) + 1):
                mass[nodes[seq[:t]]] += p
        children = np.full((n + 1, alphabet_size), dead, np.int32)
        next_p = np.zeros((n + 1, alphabet_size + 1))
        for prefix, i in nodes.items():
            if prefix:
                parent, sym = nodes[prefix[:-1]], prefix[-1]
                children[parent, sym] = i
        for i in nodes.values():
            if mass[i] > 0:
                for a in range(alphabet_size):
                    c = children[i, a]
                    next_p[i, a] = mass[c] / mass[i] if c != dead else 0.0
                next_p[i, alphabet_size] = end[i] / mass[i]
        with np.errstate(divide="ignore"):
            next_logp = np.log(next_p)
        return cls(
            next_logprobs=jnp.asarray(next_logp, jnp.float32),
            children=jnp.asarray(children),
            alphabet_size=alphabet_size,
        )

    @property
    def dead_node(self) -> int:
        return self.children.shape[0] - 1

    def init(self, num_particles: int) -> Int[Array, "M"]:
        return jnp.zeros((num_particles,), jnp.int32)

    def logprobs(self, state: Int[Array, "M"]) -> Float[Array, "M 1 A1"]:
        return self.next_logprobs[state][:, None, :]

    def advance(self, state: Int[Array, "M"], symbols: Int[Array, "M"], active: Bool[Array, "M"]) -> Int[Array, "M"]:
        sym = jnp.clip(symbols, 0, self.alphabet_size - 1)
        return jnp.where(active, self.children[state, sym], state)

    def reorder(self, state: Int[Array, "M"], ancestors: Int[Array, "M"]) -> Int[Array, "M"]:
        return take_particles(state, ancestors)


@struct.dataclass
class NGramExpert:
    """One expert with an n-gram table: log p(a | last n-1 symbols), BOS-padded, with EOS.

    Contexts are encoded in base (A + 1), the digit A standing for BOS, most recent last.

    Attributes
    ----------
    table : jax.Array, shape [C, A + 1]
        log p(a | context) for the C = (A + 1)^(order - 1) contexts.
    alphabet_size : int
        A.
    order : int
        n.
    num_experts : int
        1.
    """

    table: Float[Array, "C A1"]
    alphabet_size: int = struct.field(pytree_node=False)
    order: int = struct.field(pytree_node=False)
    num_experts: int = struct.field(pytree_node=False, default=1)

    @classmethod
    def from_table(cls, table: np.ndarray | Array, alphabet_size: int, order: int) -> "NGramExpert":
        """`table[c, a]` = p(a | context c) (probabilities, rows summing to 1).

        Parameters
        ----------
        table : array, shape [C, A + 1]
            Probabilities p(a | context c), rows summing to 1.
        alphabet_size : int
            A.
        order : int
            n.
        """
        table = np.asarray(table, np.float64)
        n_ctx = (alphabet_size + 1) ** (order - 1)
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if table.shape != (n_ctx, alphabet_size + 1):
            raise ValueError(f"expected a table of shape {(n_ctx, alphabet_size + 1)}, got {table.shape}")
        if np.any(table < 0) or not np.allclose(table.sum(-1), 1.0, atol=TABLE_SUM_TOLERANCE):
            raise ValueError("every row of an n-gram table must be a probability distribution")
        with np.errstate(divide="ignore"):
            logt = np.log(table)
        return cls(table=jnp.asarray(logt, jnp.float32), alphabet_size=alphabet_size, order=order)

    @classmethod
    def random(
        cls, key: PRNGKeyArray, alphabet_size: int, order: int = 2, eos_logit: float = 0.0, concentration: float = 1.0
    ) -> "NGramExpert":
        """A random n-gram table: rows ~ softmax(Gumbel-ish logits / concentration); the EOS
        logit is shifted by `eos_logit` (larger means shorter strings).

        Parameters
        ----------
        key : jax.Array
            PRNG key.
        alphabet_size : int
            A.
        order : int
            n (2: bigrams).
        eos_logit : float
            Added to the EOS logit of every row.
        concentration : float
            Temperature of the rows (smaller: peakier).
        """
        n_ctx = (alphabet_size + 1) ** (order - 1)
        logits = jax.random.normal(key, (n_ctx, alphabet_size + 1)) / concentration
        logits = logits.at[:, alphabet_size].add(eos_logit)
        return cls.from_table(np.asarray(jax.nn.softmax(logits, -1), np.float64), alphabet_size, order)

    @property
    def num_contexts(self) -> int:
        return self.table.shape[0]

    def init(self, num_particles: int) -> Int[Array, "M"]:
        bos = eos_symbol(self.alphabet_size)
        code = sum(bos * (self.alphabet_size + 1) ** i for i in range(self.order - 1))
        return jnp.full((num_particles,), code, jnp.int32)

    def logprobs(self, state: Int[Array, "M"]) -> Float[Array, "M 1 A1"]:
        return self.table[state][:, None, :]

    def advance(self, state: Int[Array, "M"], symbols: Int[Array, "M"], active: Bool[Array, "M"]) -> Int[Array, "M"]:
        sym = jnp.clip(symbols, 0, self.alphabet_size - 1)
        new = (state * (self.alphabet_size + 1) + sym) % self.num_contexts
        return jnp.where(active, new, state)

    def reorder(self, state: Int[Array, "M"], ancestors: Int[Array, "M"]) -> Int[Array, "M"]:
        return take_particles(state, ancestors)


@struct.dataclass
class NGramTokenLM:
    """A toy token LM behind the paged-model interface (`models.contexts.PagedModel`).

    Next-token logits come from a table indexed by the last (order - 1) tokens of the context
    (prompt tokens, then continuation tokens), BOS-padded; digit V stands for BOS. Its pool stores
    each entry's token id, so the context is rebuilt from the entry path: a test of the paging.
    The prefix ("prompt cache") is the prompt's last order - 1 tokens.
    """

    table: Float[Array, "C V"]  # logits
    vocab_size: int = struct.field(pytree_node=False)
    order: int = struct.field(pytree_node=False)

    @classmethod
    def random(cls, key: PRNGKeyArray, vocab_size: int, order: int = 2, scale: float = 1.5) -> "NGramTokenLM":
        n_ctx = (vocab_size + 1) ** (order - 1)
        return cls(table=scale * jax.random.normal(key, (n_ctx, vocab_size)), vocab_size=vocab_size, order=order)

    def _code(self, history: Int[Array, "... H"]) -> Int[Array, "..."]:
        base = self.vocab_size + 1
        weights = base ** jnp.arange(history.shape[-1] - 1, -1, -1)
        return jnp.sum(history * weights, axis=-1)

    def prefill(self, prompt: Sequence[int]) -> tuple[Int[Array, "H"], Float[Array, "V"]]:
        h = self.order - 1
        bos = self.vocab_size
        history = jnp.asarray(([bos] * h + list(prompt))[len(prompt) :] if h else [], jnp.int32)
        return history, self.table[self._code(history)] if h else self.table[0]

    def init_pool(self, capacity: int) -> Int[Array, "N"]:
        return jnp.zeros((capacity,), jnp.int32)

    def step(self, prefix, pool, paths, depth, tokens, write_at, tree=False, span=None):
        h = self.order - 1
        # Written before it is read: a path may name an entry this call writes (`tree`).
        pool = pool.at[write_at].set(tokens, mode="drop")
        if h == 0:
            return self.table[jnp.zeros_like(tokens)], pool
        s = paths.shape[1]
        c = tokens.shape[0]
        continuation = jnp.where(jnp.arange(s)[None] < depth[:, None], pool[paths], -1)  # [C, S]
        continuation = jnp.concatenate([continuation, jnp.full((c, 1), -1, jnp.int32)], axis=1)
        continuation = continuation.at[jnp.arange(c), depth].set(tokens)
        # history = the last h tokens of prefix ++ continuation[:depth] ++ token
        full = jnp.concatenate([jnp.broadcast_to(prefix, (c, h)), continuation], axis=1)
        ends = h + depth + 1  # exclusive end of the valid part of `full`
        idx = ends[:, None] - h + jnp.arange(h)[None]
        history = jnp.take_along_axis(full, idx, axis=1)
        return self.table[self._code(history)], pool

    def logits_of(self, prompt: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        """Reference: next-token logits after prompt ++ continuation, computed directly."""
        h = self.order - 1
        seq = [self.vocab_size] * h + list(prompt) + list(continuation)
        code = sum(t * (self.vocab_size + 1) ** (h - 1 - i) for i, t in enumerate(seq[len(seq) - h :])) if h else 0
        return np.asarray(self.table[code])
