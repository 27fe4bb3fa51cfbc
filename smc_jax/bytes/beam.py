"""The beam over tokenizations: a byte-level LM from a token-level one, as fixed-shape arrays.

A *hypothesis* h = (committed tokens c, trie node u) stands for every token sequence that starts
with c and whose next token's bytes start with u's path. Its weight is

    w(h) = log p(c) + log m_c(u),    m_c(u) = sum of p(t | c) over tokens t with bytes(t) >= u,

so that the bytes consumed so far have prefix probability sum_h e^{w(h)} (exactly, when no
hypothesis is pruned: every token sequence that decodes past the consumed bytes is counted once).
Reading a byte b moves u to child(u, b): w += log m_c(child) - log m_c(u), no model call.
*Extending* h by a token t that ends at u (bytes(t) = path(u)) gives (c + t, root) with weight
log p(c) + log p(t | c): the only place the model is called (for p(. | c + t)).

The next-byte distribution over 256 bytes + EOS (index EOS_BYTE) is, up to normalization,

    sum over hypotheses h:          e^{log p(c) + log m_c(child(u, b))}      (bytes b)
                                    e^{log p(c) + log p(EOS | c)}            (EOS, u = root)
    + sum over kept extensions e:   the same terms for (c + t, root),

where the tokens ending at u are counted through the extensions only. EOS is reachable only at
a token boundary. The token distribution is renormalized over the byte tokens and EOS ids
(control tokens without bytes, e.g. <|im_start|>, are excluded), so m_c(root) = 1.

Pruning follows genlm-bytes' ByteBeamState, so the two agree at equal settings:
* next-byte distribution: over the unpruned beam S, with the extensions whose weight is above
  `threshold` times the total weight of S and of all extensions;
* reading a byte b: prune S (keep hypotheses above `threshold` times the beam's total, then
  the B heaviest), advance them by b, and add the extensions of the pruned beam that stay above
  `threshold` times the total of the advanced hypotheses and those extensions.
Extensions are materialized when needed, batched over particles and slots (one model call): the
next-byte distribution needs those above its threshold; reading byte b needs those the shift by
b keeps. A call made for the former also takes every extension the next shift could keep,
whatever the byte (`ExtensionRequests.shift`), so that shift makes no call of its own; when no
beam needs a call for its distribution, nothing is called and the shift fetches only what byte b
keeps (`shift_requests`, usually nothing). Symmetrically, a call made by the shift also takes the
extensions the distribution after it may need among those whose parents exist already
(`lookahead_requests`), so a byte step rarely calls twice. Shapes: M particles, C = B (1 + D)
slots, D = the trie's max duplicates, H = C + C D candidates of a shift.

A byte that none of the kept hypotheses can read empties the beam: token healing
(`smc_jax.bytes.healing`, `BeamConfig.heal`, on by default) then backs off into a hypothesis'
current token and re-reads its bytes with another tokenization.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import numpy as np
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from smc_jax.bytes.sumtree import SumTree, build_sum_tree
from smc_jax.bytes.trie import NO_NODE, ROOT, TokenTrie, child, ending_tokens, next_byte_logmass, node_logmass
from smc_jax.bytes.vocab import NUM_BYTES
from smc_jax.models.contexts import NO_CONTEXT

#: Index of end-of-string in next-byte arrays (256 bytes, then EOS).
EOS_BYTE = NUM_BYTES
NUM_BYTE_SYMBOLS = NUM_BYTES + 1


class ByteSummary(struct.PyTreeNode):
    """What a byte-level expert keeps of a context's next-token distribution."""

    tree: SumTree  # log-space sum tree over the byte tokens in trie order
    eos: Float[Array, "..."]  # log p(EOS | context)
    root_children: Float[Array, "... 256"]  # log m(child(root, b)): every fresh token's first byte


def summarize_logits(
    logits: Float[Array, "U V"],
    trie: TokenTrie,
    allowed: Bool[Array, "V"],
    eos_ids: tuple[int, ...],
    temperature: float = 1.0,
) -> ByteSummary:
    """log p(t | c) renormalized over the allowed ids (byte tokens and EOS), as a sum tree."""
    logits = jnp.where(allowed, logits.astype(jnp.float32) / temperature, -jnp.inf)
    logp = jax.nn.log_softmax(logits, axis=-1)
    eos = jax.nn.logsumexp(logp[..., jnp.asarray(eos_ids, jnp.int32)], axis=-1)
    sorted_logp = trie.sort_logprobs(logp)
    tree = build_sum_tree(sorted_logp)
    root_children = jax.vmap(lambda row: next_byte_logmass(trie, tree, ROOT, row))(jnp.arange(logits.shape[0]))
    return ByteSummary(tree=tree, eos=eos, root_children=root_children)


class BeamState(NamedTuple):
    """The beams of M particles of one expert (slots padded with NO_CONTEXT)."""

    context: Int[Array, "M C"]
    node: Int[Array, "M C"]
    logp: Float[Array, "M C"]  # log p(committed tokens)
    weight: Float[Array, "M C"]  # log p(c) + log m_c(u); -inf for an empty slot
    ext_context: Int[Array, "M C D"]  # materialized extension contexts, NO_CONTEXT elsewhere
    next_logp: Float[Array, "M B1"]  # normalized next-byte log-probabilities (B1 = 257)
    log_mass: Float[Array, "M"]  # log of the beam's total weight (prefix probability estimate)
    # Token healing (`smc_jax.bytes.healing`): bytes healed so far, whether the last byte read
    # was healed, and then the log-probability it got (0 elsewhere).
    heals: Int[Array, "M"]
    healed: Bool[Array, "M"]
    healed_logp: Float[Array, "M"]


@struct.dataclass
class BeamConfig:
    """Beam width B and relative prune threshold (0 = never prune by mass).

    B, not K: K is the number of experts everywhere else in the package.

    `heal`: adaptive token healing (`smc_jax.bytes.healing`) when a byte empties the beam, backing
    off at most `heal_max_backoff` bytes into a hypothesis' current token (on by default, like
    genlm-bytes; it never triggers, and changes nothing, while some hypothesis can read the byte).
    """

    width: int = struct.field(pytree_node=False)
    # The threshold is a run-time value (a new one reuses the programs); its log is taken on the
    # host, in float64 then rounded, as a Python constant compiled in was.
    threshold: float = 0.0
    heal: bool = struct.field(pytree_node=False, default=True)
    heal_max_backoff: int = struct.field(pytree_node=False, default=16)
    log_threshold: Float[Array, ""] | None = None  # log(threshold), -inf for 0; set from it when None

    def __post_init__(self):
        # Only for a config given numbers: pytree maps also rebuild it with specs, shapes or tracers.
        if self.log_threshold is None and isinstance(self.threshold, (int, float, np.floating)):
            t = float(self.threshold)
            object.__setattr__(self, "log_threshold", np.float32(math.log(t) if t > 0 else -math.inf))
        if isinstance(self.threshold, (int, float)):  # a leaf with a shape and dtype, like the others
            object.__setattr__(self, "threshold", np.float32(self.threshold))


def _lse(x: Array, axis) -> Array:
    top = jnp.max(x, axis=axis, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    return jnp.squeeze(top, axis) + jnp.log(jnp.sum(jnp.exp(x - top), axis=axis))


def initial_beam(num_particles: int, num_slots: int, duplicates: int, prompt_context: int) -> BeamState:
    """Every particle: one hypothesis (prompt context, root) of weight log m(root) = 0."""
    slot0 = jnp.arange(num_slots) == 0
    m = num_particles
    return BeamState(
        context=jnp.broadcast_to(jnp.where(slot0, prompt_context, NO_CONTEXT), (m, num_slots)).astype(jnp.int32),
        node=jnp.full((m, num_slots), ROOT, jnp.int32),
        logp=jnp.broadcast_to(jnp.where(slot0, 0.0, -jnp.inf), (m, num_slots)).astype(jnp.float32),
        weight=jnp.broadcast_to(jnp.where(slot0, 0.0, -jnp.inf), (m, num_slots)).astype(jnp.float32),
        ext_context=jnp.full((m, num_slots, duplicates), NO_CONTEXT, jnp.int32),
        next_logp=jnp.full((m, NUM_BYTE_SYMBOLS), -jnp.inf, jnp.float32),
        log_mass=jnp.zeros((m,), jnp.float32),
        heals=jnp.zeros((m,), jnp.int32),
        healed=jnp.zeros((m,), bool),
        healed_logp=jnp.zeros((m,), jnp.float32),
    )


def _row(context: Int[Array, "..."], num_contexts: int) -> Int[Array, "..."]:
    return jnp.clip(context, 0, num_contexts - 1)


class Extensions(NamedTuple):
    token: Int[Array, "M C D"]
    weight: Float[Array, "M C D"]  # log p(c) + log p(t | c); -inf where none


def extensions(trie: TokenTrie, table: ByteSummary, beam: BeamState) -> Extensions:
    """The token each hypothesis could commit (tokens ending exactly at its node)."""
    return _ending_extensions(trie, table, beam.context, beam.node, beam.logp)


def _ending_extensions(
    trie: TokenTrie, table: ByteSummary, context: Int[Array, "M H"], node: Int[Array, "M H"], logp: Float[Array, "M H"]
) -> Extensions:
    """`extensions` of hypotheses given as (context, node, log p(context)) arrays."""
    valid = context != NO_CONTEXT
    ends = ending_tokens(trie, table.tree, jnp.where(valid, node, NO_NODE), _row(context, table.eos.shape[0]))
    weight = jnp.where(ends.mask, logp[..., None] + ends.logprobs, -jnp.inf)
    return Extensions(token=jnp.where(ends.mask, ends.token_ids, 0), weight=weight)


def prune_mask(weight: Float[Array, "M C"], config: BeamConfig) -> Bool[Array, "M C"]:
    """genlm's prune(): above threshold * total weight, then the B (width) heaviest."""
    total = _lse(weight, axis=-1)
    above = (weight - total[:, None] > config.log_threshold) & jnp.isfinite(weight)
    ranked = jnp.where(above, weight, -jnp.inf)
    order = jnp.argsort(-ranked, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)
    return above & (rank < config.width)


def _next_byte_threshold_mask(
    trie: TokenTrie, beam: BeamState, ext: Extensions, config: BeamConfig
) -> Bool[Array, "M C D"]:
    """Extensions included in the next-byte distribution (relative to beam + all extensions).

    With healing on, a beam whose every hypothesis sits at a node without children (inside no
    longer token) includes all its extensions: the threshold could otherwise drop them all (an
    extension's mass also counts in its slot's weight, so it is at most half of the total) and
    leave an empty distribution. Nothing changes for any other beam."""
    total = jnp.logaddexp(_lse(beam.weight, axis=-1), _lse(ext.weight.reshape(ext.weight.shape[0], -1), axis=-1))
    mask = (ext.weight - total[:, None, None] > config.log_threshold) & jnp.isfinite(ext.weight)
    if config.heal:
        node = jnp.clip(beam.node, 0, trie.num_nodes - 1)
        open_slot = (beam.context != NO_CONTEXT) & ((beam.node == ROOT) | (trie.node_num_children[node] > 0))
        stuck = ~jnp.any(open_slot, axis=-1)
        mask = mask | (stuck[:, None, None] & jnp.isfinite(ext.weight))
    return mask


def _shift_prefilter_mask(beam: BeamState, ext: Extensions, config: BeamConfig) -> Bool[Array, "M C D"]:
    """Extensions that the next byte's shift may keep, whatever the byte: those of the pruned
    beam above threshold * (their own total) - a necessary condition, since the shift's total
    also counts the advanced hypotheses."""
    kept = prune_mask(beam.weight, config)[..., None]
    w = jnp.where(kept, ext.weight, -jnp.inf)
    total = _lse(w.reshape(w.shape[0], -1), axis=-1)
    return (w - total[:, None, None] > config.log_threshold) & jnp.isfinite(w)


class ExtensionRequests(NamedTuple):
    """The extensions of a beam that are not materialized yet, as (parent context, token) pairs."""

    parent: Int[Array, "M C D"]
    token: Int[Array, "M C D"]
    next_byte: Bool[Array, "M C D"]  # needed by the next-byte distribution
    shift: Bool[Array, "M C D"]  # possibly kept by the next shift (for some byte)


def extension_requests(trie: TokenTrie, table: ByteSummary, beam: BeamState, config: BeamConfig) -> ExtensionRequests:
    ext = extensions(trie, table, beam)
    missing = beam.ext_context == NO_CONTEXT
    parent = jnp.broadcast_to(beam.context[..., None], ext.token.shape)
    return ExtensionRequests(
        parent=parent,
        token=ext.token,
        next_byte=_next_byte_threshold_mask(trie, beam, ext, config) & missing,
        shift=_shift_prefilter_mask(beam, ext, config) & missing,
    )


class ShiftPlan(NamedTuple):
    """Reading a byte, before any model call: the advanced hypotheses and the kept extensions
    (independent of which extensions are materialized, so computed once per shift)."""

    moved: Int[Array, "M C"]  # child(u, b), NO_NODE where none
    weight: Float[Array, "M C"]  # log p(c) + log m_c(child)
    ext: Extensions
    ext_weight: Float[Array, "M C D"]  # extension weights of the pruned beam
    keep_ext: Bool[Array, "M C D"]  # extensions the shift keeps (materialized or not)
    # The new beam's candidates whose contexts exist before the shift (the advanced hypotheses,
    # then the kept extensions materialized already; NO_CONTEXT for the others), their extensions,
    # and those the next-byte distribution after the shift may include.
    ahead_context: Int[Array, "M H"]  # H = C + C D, the shift's candidate order
    ahead: Extensions  # [M, H, D]
    keep_ahead: Bool[Array, "M H D"]


def plan_shift(trie: TokenTrie, table: ByteSummary, beam: BeamState, byte: Int[Array, "M"], config: BeamConfig) -> ShiftPlan:
    m, c, _ = beam.ext_context.shape
    kept = prune_mask(beam.weight, config)
    rows = _row(beam.context, table.eos.shape[0])
    moved = child(trie, jnp.where(kept, beam.node, NO_NODE), jnp.broadcast_to(byte[:, None], (m, c)))
    weight = jnp.where(moved != NO_NODE, beam.logp + node_logmass(trie, table.tree, moved, rows), -jnp.inf)
    ext = extensions(trie, table, beam)
    ext_w = jnp.where(kept[..., None], ext.weight, -jnp.inf)
    total = jnp.logaddexp(_lse(weight, axis=-1), _lse(ext_w.reshape(m, -1), axis=-1))
    keep_ext = (ext_w - total[:, None, None] > config.log_threshold) & jnp.isfinite(ext_w)
    # After the shift, the beam is the C heaviest candidates, at most B <= C of them advanced
    # hypotheses: its total weight is at least theirs and at least any one candidate's. An
    # extension below threshold * that bound is never in the next distribution.
    ready = keep_ext & (beam.ext_context != NO_CONTEXT)
    ext_rows = _row(beam.ext_context, table.eos.shape[0])
    ext_node = child(trie, jnp.where(ready, ROOT, NO_NODE), jnp.broadcast_to(byte[:, None, None], ready.shape))
    ext_adv = jnp.where(ext_node != NO_NODE, ext_w + node_logmass(trie, table.tree, ext_node, ext_rows), -jnp.inf)
    ahead_context = jnp.concatenate([beam.context, jnp.where(ready, beam.ext_context, NO_CONTEXT).reshape(m, -1)], axis=1)
    ahead = _ending_extensions(
        trie,
        table,
        ahead_context,
        jnp.concatenate([moved, ext_node.reshape(m, -1)], axis=1),
        jnp.concatenate([beam.logp, ext_w.reshape(m, -1)], axis=1),
    )
    bound = jnp.maximum(_lse(weight, axis=-1), jnp.max(ext_adv.reshape(m, -1), axis=-1))
    keep_ahead = (ahead.weight - bound[:, None, None] > config.log_threshold) & jnp.isfinite(ahead.weight)
    return ShiftPlan(moved, weight, ext, ext_w, keep_ext, ahead_context, ahead, keep_ahead)


def shift_requests(
    beam: BeamState, plan: ShiftPlan
) -> tuple[Int[Array, "M C D"], Int[Array, "M C D"], Bool[Array, "M C D"]]:
    """(parent context, token, wanted): the extensions the planned shift keeps that are not
    materialized yet."""
    parent = jnp.broadcast_to(beam.context[..., None], plan.ext.token.shape)
    return parent, plan.ext.token, plan.keep_ext & (beam.ext_context == NO_CONTEXT)


def lookahead_requests(plan: ShiftPlan) -> tuple[Int[Array, "M H D"], Int[Array, "M H D"], Bool[Array, "M H D"]]:
    """(parent context, token, wanted): the extensions of the new beam's candidates that the
    next-byte distribution after the planned shift may need (a superset), among those whose
    parents exist before the shift: a model call the shift makes can take them too (see `shift`)."""
    parent = jnp.broadcast_to(plan.ahead_context[..., None], plan.ahead.token.shape)
    return parent, plan.ahead.token, plan.keep_ahead


class PrefetchSources(NamedTuple):
    """The hypotheses a call looks ahead from: every one whose context exists."""

    context: Int[Array, "M H"]  # H = C + C D: the slots, then the materialized extensions
    node: Int[Array, "M H"]  # NO_NODE where there is no hypothesis
    share: Float[Array, "M H"]  # log p(c) - log(beam total); -inf where none


def prefetch_sources(trie: TokenTrie, table: ByteSummary, beam: BeamState) -> PrefetchSources:
    """The slots (c, u) and the materialized extensions (c + t, root), each with the share of
    the beam's total weight its context holds, log p(c) - log sum_h e^{w(h)}."""
    m, c, d = beam.ext_context.shape
    ext = extensions(trie, table, beam)
    has_ext = (beam.ext_context != NO_CONTEXT) & jnp.isfinite(ext.weight)
    context = jnp.concatenate([beam.context, jnp.where(has_ext, beam.ext_context, NO_CONTEXT).reshape(m, -1)], axis=1)
    node = jnp.concatenate([beam.node, jnp.full((m, c * d), ROOT, jnp.int32)], axis=1)
    logp = jnp.concatenate([beam.logp, jnp.where(has_ext, ext.weight, -jnp.inf).reshape(m, -1)], axis=1)
    valid = context != NO_CONTEXT
    share = logp - _lse(beam.weight, axis=-1)[:, None]
    return PrefetchSources(context, jnp.where(valid, node, NO_NODE), jnp.where(valid, share, -jnp.inf))


class PrefetchCandidates(NamedTuple):
    """Contexts parent + token that the next few bytes may need, each scored by the share of
    the beam's total weight that reaches the token's end."""

    parent: Int[Array, "Q"]
    token: Int[Array, "Q"]
    score: Float[Array, "Q"]  # -inf where none
    source: Int[Array, "Q"]  # the index of the hypothesis it was found from


#: Children looked at per node below the first two levels (99% of the nodes inside a token of
#: SmolLM2's and Gemma 3's tries have at most 8; the first levels, e.g. the node of " ", read all).
LOOKAHEAD_CHILDREN = 16


def prefetch_candidates(
    trie: TokenTrie, table: ByteSummary, sources: PrefetchSources, depth: int, width: int
) -> PrefetchCandidates:
    """The tokens a hypothesis (c, u) may commit within the next `depth` bytes, by a beam search
    down the trie from u: the tokens ending at u, then, at each of `depth` levels, those ending
    at the `width` nodes v of largest m_c(v) among the children of the previous level's nodes.
    The context c + t of such a token is needed once the particle has read path(v) and the
    extension passes the beam's threshold; its score is the share of the beam's weight that
    reaches v, log p(c) + log m_c(v) - log(beam total). A heuristic: creating a context changes
    no distribution, it only spares a later call.

    Parameters
    ----------
    trie, table
        The trie and the expert's context summaries.
    sources : PrefetchSources
        U hypotheses (leaves [U]).
    depth, width : int
        Bytes looked ahead, nodes kept per level.

    Returns
    -------
    PrefetchCandidates
        Q = U D (1 + depth width) candidates (D = the trie's max duplicates).
    """
    rows = _row(sources.context, table.eos.shape[0])[:, None]
    node, share = sources.node[:, None], sources.share[:, None]

    def children(nodes: Int[Array, "U F"], slots: int) -> tuple[Int[Array, "U FS"], Float[Array, "U FS"]]:
        slot = jnp.arange(slots, dtype=jnp.int32)
        safe = jnp.clip(nodes, 0, trie.num_nodes - 1)[..., None]
        exists = (slot < trie.node_num_children[safe]) & ((nodes != NO_NODE) & (nodes != ROOT))[..., None]
        kid = jnp.where(exists, trie.node_first_child[safe] + slot, NO_NODE)
        mass = node_logmass(trie, table.tree, kid, jnp.broadcast_to(rows[:, :, None], kid.shape))
        return kid.reshape(kid.shape[0], -1), mass.reshape(kid.shape[0], -1)

    def ending(nodes: Int[Array, "U F"], mass: Float[Array, "U F"]) -> PrefetchCandidates:
        ends = ending_tokens(trie, table.tree, nodes, jnp.broadcast_to(rows, nodes.shape))
        score = jnp.where(ends.mask, (share + mass)[..., None], -jnp.inf)
        parent = jnp.broadcast_to(sources.context[:, None, None], score.shape)
        source = jnp.broadcast_to(jnp.arange(score.shape[0], dtype=jnp.int32)[:, None, None], score.shape)
        return PrefetchCandidates(parent.reshape(-1), jnp.where(ends.mask, ends.token_ids, 0).reshape(-1), score.reshape(-1),
                                  source.reshape(-1))

    found = [ending(jnp.where(node == ROOT, NO_NODE, node), node_logmass(trie, table.tree, node, rows))]
    # The first level: a fresh context's first bytes (precomputed), or the children of u.
    at_root = node == ROOT
    root_mass, root_byte = jax.lax.top_k(table.root_children[rows[:, 0]], width)
    kid, mass = children(node, trie.max_inner_children)
    kid = jnp.concatenate([jnp.where(at_root, child(trie, jnp.full_like(root_byte, ROOT), root_byte), NO_NODE), kid], axis=1)
    mass = jnp.concatenate([jnp.where(at_root, root_mass, -jnp.inf), jnp.where(at_root, -jnp.inf, mass)], axis=1)
    for level in range(depth):
        if level:
            kid, mass = children(frontier, trie.max_inner_children if level == 1 else min(trie.max_inner_children, LOOKAHEAD_CHILDREN))
        frontier_mass, pick = jax.lax.top_k(jnp.where(kid != NO_NODE, mass, -jnp.inf), width)
        frontier = jnp.where(jnp.isfinite(frontier_mass), jnp.take_along_axis(kid, pick, axis=1), NO_NODE)
        found.append(ending(frontier, frontier_mass))
    return PrefetchCandidates(*(jnp.concatenate(parts) for parts in zip(*found)))


def next_byte_logprobs(
    trie: TokenTrie, table: ByteSummary, beam: BeamState, config: BeamConfig
) -> tuple[Float[Array, "M B1"], Float[Array, "M"]]:
    """The normalized next-byte distribution [M, 257] and its log normalizer.

    Needs the extensions that pass the next-byte threshold to be materialized in
    beam.ext_context (see `extension_requests`)."""
    num_contexts = table.eos.shape[0]
    valid = beam.context != NO_CONTEXT
    rows = _row(beam.context, num_contexts)

    def slot_terms(node, row, logp):
        # Inside a token: its children (at most max_inner_children of them); at the root: the
        # context's precomputed root children, and EOS (tokens ending at u go to extensions).
        inner = next_byte_logmass(trie, table.tree, node, row, trie.max_inner_children)
        at_root = node == ROOT
        children = jnp.where(at_root, table.root_children[row], inner)
        eos = jnp.where(at_root, table.eos[row], -jnp.inf)
        return logp + jnp.concatenate([children, eos[None]])

    per_slot = jax.vmap(jax.vmap(slot_terms))(
        jnp.where(valid, beam.node, ROOT), rows, jnp.where(valid, beam.logp, -jnp.inf)
    )  # [M, C, 257]

    ext = extensions(trie, table, beam)
    include = _next_byte_threshold_mask(trie, beam, ext, config) & (beam.ext_context != NO_CONTEXT)
    ext_rows = _row(beam.ext_context, num_contexts)
    ext_w = jnp.where(include, ext.weight, -jnp.inf)
    per_ext = ext_w[..., None] + jnp.concatenate([table.root_children[ext_rows], table.eos[ext_rows][..., None]], axis=-1)
    m = beam.context.shape[0]
    terms = jnp.concatenate([per_slot, per_ext.reshape(m, -1, NUM_BYTE_SYMBOLS)], axis=1)
    unnormalized = _lse(terms, axis=1)  # [M, 257]
    total = _lse(unnormalized, axis=-1)
    normalized = jnp.where(jnp.isfinite(total)[:, None], unnormalized - total[:, None], -jnp.inf)
    return normalized, total


def shift(
    trie: TokenTrie,
    table: ByteSummary,
    beam: BeamState,
    byte: Int[Array, "M"],
    plan: ShiftPlan,
    ahead_context: Int[Array, "M H D"],
) -> BeamState:
    """Reads one byte per particle as `plan_shift(..., byte, ...)` planned: prune, advance the kept
    hypotheses, add the kept extensions advanced by the byte (they must be materialized in
    beam.ext_context: see `shift_requests`). `ahead_context` holds the extension contexts of the
    candidates fetched already (`lookahead_requests`; NO_CONTEXT elsewhere): they stay with their
    hypotheses. The new beam's other extensions and its next-byte distribution are left for the
    caller."""
    num_contexts = table.eos.shape[0]
    m, c, d = beam.ext_context.shape
    moved, adv_weight, ext_w = plan.moved, plan.weight, plan.ext_weight
    keep_ext = plan.keep_ext & (beam.ext_context != NO_CONTEXT)
    ext_rows = _row(beam.ext_context, num_contexts)
    ext_node = child(trie, jnp.where(keep_ext, ROOT, NO_NODE), jnp.broadcast_to(byte[:, None, None], (m, c, d)))
    ext_adv = jnp.where(ext_node != NO_NODE, ext_w + node_logmass(trie, table.tree, ext_node, ext_rows), -jnp.inf)

    # Gather into C slots, heaviest first (at most B advanced + B * D extensions survive).
    cand_w = jnp.concatenate([adv_weight, ext_adv.reshape(m, -1)], axis=1)
    cand_ctx = jnp.concatenate([beam.context, beam.ext_context.reshape(m, -1)], axis=1)
    cand_node = jnp.concatenate([moved, ext_node.reshape(m, -1)], axis=1)
    cand_logp = jnp.concatenate([beam.logp, ext_w.reshape(m, -1)], axis=1)
    order = jnp.argsort(-cand_w, axis=1, stable=True)[:, :c]
    take = lambda x: jnp.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1)
    weight = take(cand_w)
    alive = jnp.isfinite(weight)
    return BeamState(
        context=jnp.where(alive, take(cand_ctx), NO_CONTEXT),
        node=jnp.where(alive, take(cand_node), ROOT),
        logp=jnp.where(alive, take(cand_logp), -jnp.inf),
        weight=weight,
        ext_context=jnp.where(alive[..., None], take(ahead_context), NO_CONTEXT),
        next_logp=beam.next_logp,
        log_mass=_lse(weight, axis=-1),
        heals=beam.heals,
        healed=jnp.zeros_like(beam.healed),
        healed_logp=jnp.zeros_like(beam.healed_logp),
    )
