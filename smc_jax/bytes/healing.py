"""Adaptive token healing for the beam over tokenizations, as fixed-shape arrays.

A pruned beam can reach a byte b that none of its hypotheses can read: every kept hypothesis
(c, u) sits inside a token whose prefix path(u) has no child b, and no extension that the shift
kept can read b either. Without healing, b gets probability 0 and the beam is empty from then
on (a byte-level expert is lost; under min/product ensembles the particle dies).

Healing (genlm-bytes' `TokenHealer`, on by default there too) backs off into the current token
of a hypothesis and re-reads its bytes with another tokenization. For a hypothesis h = (c, u)
with partial bytes p = path(u) (|p| = d) and a back-off of j bytes (0 <= j <= min(d, J)):

1. commit t_1 = the token whose bytes are p[:d - j] (it must exist; j = 0 commits all of p);
2. replay r = p[d - j:] + b greedily from the root of c + t_1: read a byte while the current
   node has a child for it; otherwise *split*: commit the token ending at the current node
   (t_2, t_3, ...) and read the byte from the root;
3. the healed hypothesis is (c + t_1 + ... + t_n, v), v the node reached, with weight

       w = log p(c) + sum_i log p(t_i | c + t_1..t_{i-1}) + log m_{c + t_1..t_n}(v).

Whether a candidate (h, j) succeeds depends on the trie alone (bytes, not probabilities), so all
candidates are checked at once without the model (`plan_heal`: [M, C, J + 1] candidates, each a
walk of J + 1 bytes). The first successful one in genlm's order (hypotheses of the pruned beam
heaviest first, then the longest committed prefix first, i.e. j = 0, 1, ...) is materialized:
its n <= 1 + J contexts, one model call per token, batched over particles and experts (the
caller's context store, `smc_jax.experts.byte`). The beam after the byte is that one
hypothesis (as in genlm). w counts a subset of the token sequences that decode past the bytes
read, disjoint from nothing it is added to, so a healed beam's total never exceeds the exact
prefix probability; an unpruned beam can always read a byte that has a tokenization, so healing
never triggers there and changes no value.

The healed byte's probability. The next-byte distribution computed before the byte gave it 0
(no hypothesis reads it); healing adds the healed hypothesis to the beam's next-byte terms, so
the byte's log-probability is w - logaddexp(T, w), T the log of the beam's total before the
byte (`BeamState.log_mass`): a probability in (0, 1) (`zero_byte_logprob`; the same rule gives
a probability to a byte the distribution gave 0 but the shift could read, which happens because
the shift and the distribution threshold extensions against different totals). Scoring (`byte_logprob`) reports it as the
byte's conditional; sampling never draws a byte its distribution gives 0, but a beam emptied by
a byte drawn from other experts (e.g. a mixture) is revived instead of staying empty.

End of string. EOS is reachable only at a token boundary, so a beam whose hypotheses all sit
inside tokens (or whose boundary extensions the threshold dropped) gives EOS probability 0 even
though the string has tokenizations that end it. Where EOS *must* be read -- the sampler's
forced EOS at the length limit (`at_max_length="eos"`), and the end of a scored string -- EOS
healing (`healed_eos`) takes the same candidates with EOS as the last replayed symbol: back off
j bytes, commit t_1, replay the j bytes with splits, then commit the token the replay stopped in
(t_n, which must exist). The path's term e = log p(c) + sum_i log p(t_i | ...) + log p(EOS |
c + t_1..t_n) counts one tokenization of the string followed by EOS, so P(x EOS) is never
overstated, and EOS gets e - logaddexp(T, e) like a healed byte. It runs only where EOS has
probability 0, so it changes nothing else; genlm-bytes has no EOS healing (its EOS, too, is
only reached through a token boundary).

Differences from genlm-bytes (0.2.0, `byte_lm/heal.py`):
* the back-off is bounded (`BeamConfig.heal_max_backoff`, J = 16 by default; genlm: unlimited)
  and so are the splits (at most one per replayed byte, <= J);
* among duplicate tokens (several ids with one byte string) the first in trie order (lowest id)
  is committed; genlm tries them in its trie's order and takes the first that works, and all
  duplicates read the same bytes, so it also commits the first;
* beam order: ours is heaviest first (slots sorted by weight after every shift), genlm's is the
  order candidates were appended;
* the healed byte's conditional above (genlm heals the beam state only: its `logp_next` gave
  the byte 0, and only its prefix weight logZ becomes finite again).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from smc_jax.bytes.beam import EOS_BYTE, BeamConfig, BeamState, ByteSummary, prune_mask
from smc_jax.bytes.sumtree import leaf_logprobs
from smc_jax.bytes.trie import NO_NODE, ROOT, TokenTrie, child, node_logmass
from smc_jax.models.contexts import NO_CONTEXT


class HealPlan(NamedTuple):
    """The healing path chosen for each particle (meaningful where `found`). S = J + 1 tokens."""

    found: Bool[Array, "M"]
    source: Int[Array, "M"]  # context c of the backed-off hypothesis
    source_logp: Float[Array, "M"]  # log p(c)
    tokens: Int[Array, "M S"]  # t_1, ..., t_n (then 0)
    positions: Int[Array, "M S"]  # their sorted (trie) positions, for p(t_i | ...)
    count: Int[Array, "M"]  # n
    node: Int[Array, "M"]  # the node v reached in the last context


def _parent(trie: TokenTrie, node: Int[Array, "..."]) -> Int[Array, "..."]:
    return jnp.where(node == NO_NODE, NO_NODE, trie.node_parent[jnp.clip(node, 0, trie.num_nodes - 1)])


def _ends_token(trie: TokenTrie, node: Int[Array, "..."]) -> Bool[Array, "..."]:
    """Some token's bytes are exactly path(node) (never at the root or NO_NODE)."""
    safe = jnp.clip(node, 0, trie.num_nodes - 1)
    return (node != NO_NODE) & (trie.node_end_hi[safe] > trie.node_lo[safe])


def plan_heal(trie: TokenTrie, beam: BeamState, byte: Int[Array, "M"], config: BeamConfig) -> HealPlan:
    """Checks every healing candidate of the beam *before* it reads `byte` (trie only, no model).
    A byte equal to EOS_BYTE plans an EOS heal: the replay ends by closing the token it is in
    (committing it; nothing to close at the root), and the plan's node is the root.

    Candidates: the hypotheses the shift keeps (`prune_mask`; for EOS, all of them) x back-offs
    j = 0..J. The walk is a scan over the J + 1 replay positions of all candidates at once
    (position i of back-off j replays p[d - j + i] for i < j, then the byte at i = j; positions
    i > j are idle)."""
    m, c = beam.node.shape
    s = config.heal_max_backoff + 1
    # A byte backs off from the hypotheses the shift keeps (genlm's pruned beam); EOS, read
    # without a shift, from every hypothesis of the beam.
    kept = (prune_mask(beam.weight, config) | (byte == EOS_BYTE)[:, None]) & (beam.context != NO_CONTEXT)
    node = jnp.where(kept, beam.node, NO_NODE)
    # ancestors[..., j]: the node j bytes above u (NO_NODE above the root). Loops are scans, so
    # the program holds one copy of their body whatever J is.
    climb = lambda u, _: (_parent(trie, u), u)
    ancestors = jnp.moveaxis(jax.lax.scan(climb, node, length=s)[1], 0, -1)  # [M, C, S]
    labels = jnp.where(ancestors == NO_NODE, 0, trie.node_byte[jnp.clip(ancestors, 0, trie.num_nodes - 1)])
    back = jnp.arange(s)  # j
    step = jnp.arange(s)  # i
    # replay[m, c, j, i] = label of ancestor j - 1 - i (the byte at depth d - j + i), then `byte`.
    source_index = jnp.clip(back[:, None] - 1 - step[None, :], 0, s - 1)  # [S(j), S(i)]
    replay = jnp.where(
        (step[None, :] < back[:, None])[None, None],
        labels[:, :, source_index],
        jnp.broadcast_to(byte[:, None, None, None], (m, c, s, s)),
    )
    start = ancestors  # the node committed as t_1, per back-off j: [M, C, S]
    ok = _ends_token(trie, start)  # false for NO_NODE (j > d) and the root
    first_position = trie.node_lo[jnp.clip(start, 0, trie.num_nodes - 1)]

    # Greedy replay of every candidate, one replay position i per scan step.
    def replay_one(carry, inputs):
        ok, current, splits, split_positions = carry
        i, x = inputs
        live = ok & (i <= back)[None, None]
        # EOS (only ever the last replayed symbol) closes the current token instead of reading.
        close = live & (x == EOS_BYTE)
        nxt = child(trie, current, x)  # NO_NODE for EOS
        fresh = jnp.where(close, ROOT, child(trie, jnp.full_like(current, ROOT), x))
        split = live & (nxt == NO_NODE) & ~(close & (current == ROOT))
        can = _ends_token(trie, current) & (fresh != NO_NODE)
        ok = ok & ~(split & ~can)
        split = split & ok
        position = trie.node_lo[jnp.clip(current, 0, trie.num_nodes - 1)]
        slot = jnp.arange(s) == splits[..., None]
        split_positions = jnp.where(split[..., None] & slot, position[..., None], split_positions)
        splits = splits + split.astype(jnp.int32)
        current = jnp.where(live & ok, jnp.where(nxt != NO_NODE, nxt, fresh), current)
        return (ok, current, splits, split_positions), None

    start_carry = (
        ok,
        jnp.full((m, c, s), ROOT, jnp.int32),
        jnp.zeros((m, c, s), jnp.int32),
        jnp.zeros((m, c, s, s), jnp.int32),  # [..., k]: token k + 1's position
    )
    (ok, current, splits, split_positions), _ = jax.lax.scan(
        replay_one, start_carry, (step, jnp.moveaxis(replay, -1, 0))
    )

    # First success in (slot, j) order; slots are heaviest first.
    flat_ok = ok.reshape(m, c * s)
    pick = jnp.argmax(flat_ok, axis=1)
    found = jnp.any(flat_ok, axis=1)
    take = lambda x: x.reshape((m, c * s) + x.shape[3:])[jnp.arange(m), pick]
    slot_index = pick // s
    positions = jnp.concatenate([take(first_position)[:, None], take(split_positions)[:, : s - 1]], axis=1)
    count = 1 + take(splits)
    positions = jnp.where(jnp.arange(s)[None] < count[:, None], positions, 0)
    tokens = jnp.where(jnp.arange(s)[None] < count[:, None], trie.sorted_token_ids[positions], 0)
    return HealPlan(
        found=found,
        source=jnp.take_along_axis(beam.context, slot_index[:, None], axis=1)[:, 0],
        source_logp=jnp.take_along_axis(beam.logp, slot_index[:, None], axis=1)[:, 0],
        tokens=tokens,
        positions=positions,
        count=jnp.where(found, count, 0),
        node=take(current),
    )


def token_logprob(table: ByteSummary, context: Int[Array, "M"], position: Int[Array, "M"]) -> Float[Array, "M"]:
    """log p(t | context) of the token at sorted position `position` (-inf for NO_CONTEXT)."""
    rows = jnp.clip(context, 0, table.eos.shape[0] - 1)
    return jnp.where(context != NO_CONTEXT, leaf_logprobs(table.tree, position, rows), -jnp.inf)


def healed_beam(
    trie: TokenTrie,
    table: ByteSummary,
    shifted: BeamState,
    before: BeamState,
    heal: Bool[Array, "M"],
    context: Int[Array, "M"],
    logp: Float[Array, "M"],
    node: Int[Array, "M"],
) -> BeamState:
    """The beam after the byte where `heal`: the one healed hypothesis (context, node) with
    log p(tokens) = logp, in slot 0; `shifted` elsewhere. Records the heal and the byte's
    log p(tokens) = logp, in slot 0; `shifted` elsewhere (the byte's probability: see
    `zero_byte_logprob`)."""
    rows = jnp.clip(context, 0, table.eos.shape[0] - 1)
    weight = jnp.where(context != NO_CONTEXT, logp + node_logmass(trie, table.tree, node, rows), -jnp.inf)
    heal = heal & jnp.isfinite(weight)
    slot0 = (jnp.arange(shifted.context.shape[1]) == 0)[None]
    put = lambda value, empty, old: jnp.where(heal[:, None], jnp.where(slot0, value[:, None], empty), old)
    return shifted._replace(
        context=put(context, NO_CONTEXT, shifted.context),
        node=put(node, ROOT, shifted.node),
        logp=put(logp, -jnp.inf, shifted.logp),
        weight=put(weight, -jnp.inf, shifted.weight),
        ext_context=jnp.where(heal[:, None, None], NO_CONTEXT, shifted.ext_context),
        log_mass=jnp.where(heal, weight, shifted.log_mass),
        heals=shifted.heals + heal.astype(jnp.int32),
    )


def zero_byte_logprob(before: BeamState, after: BeamState, byte: Int[Array, "M"]) -> BeamState:
    """Records, in `after`, the log-probability of a byte that `before`'s next-byte distribution
    gave 0 but that the beam read (healed, or kept by the shift: the shift keeps extensions above
    threshold x the total of what it keeps, the distribution those above threshold x the total
    of the whole beam and every extension, as in genlm): w - logaddexp(T, w), w the log of the
    total weight after the byte, T before it."""
    zero = ~jnp.isfinite(jnp.take_along_axis(before.next_logp, byte[:, None], axis=1)[:, 0])
    w = after.log_mass
    read = zero & jnp.isfinite(w) & jnp.isfinite(before.log_mass)
    byte_logp = w - jnp.logaddexp(before.log_mass, w)
    return after._replace(healed=read, healed_logp=jnp.where(read, byte_logp, 0.0))


def healed_eos(
    table: ByteSummary, beam: BeamState, heal: Bool[Array, "M"], context: Int[Array, "M"], logp: Float[Array, "M"]
) -> BeamState:
    """The next-byte distribution with EOS healed where `heal`: the path's term
    e = log p(tokens) + log p(EOS | context) joins the beam's terms (total T = `log_mass`), so

        p(EOS) = e^e / (e^T + e^e),    p(b) = p_before(b) e^T / (e^T + e^e),

    the rule of a healed byte (`zero_byte_logprob`). Counts the heal; `log_mass` is unchanged."""
    rows = jnp.clip(context, 0, table.eos.shape[0] - 1)
    e = jnp.where(context != NO_CONTEXT, logp + table.eos[rows], -jnp.inf)
    heal = heal & jnp.isfinite(e) & jnp.isfinite(beam.log_mass)
    norm = jnp.logaddexp(beam.log_mass, e)
    healed = jnp.concatenate(
        [beam.next_logp[:, :EOS_BYTE] + (beam.log_mass - norm)[:, None], (e - norm)[:, None]], axis=1
    )
    return beam._replace(
        next_logp=jnp.where(heal[:, None], healed, beam.next_logp),
        heals=beam.heals + heal.astype(jnp.int32),
    )
