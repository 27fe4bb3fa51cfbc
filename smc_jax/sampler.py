"""The ensemble sampler in a few calls: experts are (model, prompt) pairs::

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
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from smc_jax.bytes.vocab import token_byte_strings
from smc_jax.experts.byte import ByteExperts, ByteLogprob, byte_logprob, byte_vocabulary
from smc_jax.smc.ensemble import Ensemble, constrained, make_ensemble
from smc_jax.experts.constraint import NO_HORIZON, Automaton, merge_constraints, merged_states
from smc_jax.experts.base import ExpertStack
from smc_jax.experts.token import TokenExperts
from smc_jax.models.contexts import ContextStoreOverflowError
from smc_jax.models.lm import LanguageModel, Prompt, prefill_prompts
from smc_jax.models.tokenizer import check_prompt
from smc_jax.settings import (
    CAPACITY_GROWTH,
    DEFAULTS,
    MAX_CAPACITY_SCALE,
    SAMPLER_CONTEXTS_PER_BEAM_SLOT,
    Level,
    SamplerSettings,
)
from smc_jax.smc.sharding import ParamRules, check_mesh, resolve_rules, sample_sharded, shard_experts
from smc_jax.smc.batch import check_problem_mesh, sample_problems
from smc_jax.utils.problems import PROBLEMS
from smc_jax.smc.engine import SMC, length_bucket
from smc_jax.smc.result import SMCResult
from smc_jax.scoring import scorer_for


@dataclasses.dataclass(frozen=True)
class Expert:
    """One expert: a model under a prompt (raw text, or chat messages for its chat template).

    Attributes
    ----------
    model : LanguageModel
        The model, from `load_model`.
    prompt : str or list of dict
        Raw text, or chat messages (``{"role": ..., "content": ...}``) rendered with the model's
        chat template.
    """

    model: LanguageModel
    prompt: Prompt

    def __post_init__(self):
        check_prompt(self.prompt)  # a clear error now, not a tokenizer TypeError later

    def prompt_ids(self) -> list[int]:
        """The prompt's token ids (the chat template applied to messages; raw text tokenized canonically)."""
        return self.model.encode_prompt(self.prompt)


def as_experts(experts: Sequence[Expert | tuple[LanguageModel, Prompt]]) -> list[Expert]:
    """`Expert` objects from experts given as `Expert` or `(model, prompt)` pairs.

    Parameters
    ----------
    experts : sequence of Expert or (LanguageModel, prompt) tuples
        At least one expert.
    """
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


def as_constraints(constraint) -> tuple[Automaton, ...]:
    """None, one compiled constraint or a sequence of them, as a tuple (checked).

    Parameters
    ----------
    constraint : Automaton, sequence of Automaton or None
        From `smc_jax.constraints.regex` / `json_schema`.
    """
    if constraint is None:
        return ()
    items = (constraint,) if isinstance(constraint, Automaton) else tuple(constraint)
    for c in items:
        if not isinstance(c, Automaton):
            raise TypeError(
                f"a constraint is a compiled automaton from smc_jax.constraints.regex(...) or "
                f".json_schema(...), got {type(c).__name__}"
            )
    return items


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


class EnsembleSampler:
    """A reusable sampler for fixed experts and settings (compiled once, then one call per seed).

    Parameters
    ----------
    experts : sequence of Expert or (model, prompt)
        The experts; `sampler(seed)` returns an `SMCResult` whose texts are decoded strings and
        whose `expert_logprobs[:, k]` follow this order.
    f : str, float or Ensemble
        The ensemble function (see `sample`).
    weights : sequence of float, optional
        Expert weights on the simplex (uniform by default).
    settings : SamplerSettings, optional
        How to sample (`smc_jax.settings`); its defaults are the library's.
    mesh : jax.sharding.Mesh, optional
        A device mesh from `smc_jax.smc.sharding.make_mesh` to split the particles over (M must be
        a multiple of its "particles" size). Same seed, same result with or without a mesh.
    sharding_rules : str or ParamRules
        How model weights use the mesh's "model" axis ("replicated", "tensor_parallel" or a
        rule table; see `smc_jax.smc.sharding`).
    **options
        Any `SamplerSettings` field by name (level, num_particles, max_length, beam_width, ...),
        overriding `settings`; e.g. ``EnsembleSampler(experts, level="token", num_particles=4)``.

    constraint : Automaton or sequence of Automaton, optional
        Automata from `smc_jax.constraints` (see `sample`); each is a separate factor of the
        target, read over bytes (level="byte") or the experts' shared tokens (a [states, V] table
        built once per sampler); under at_max_length="eos" their viability looks max_length ahead.

    The sampler owns its caches: the built expert groups (prompts prefilled once per context
    store scale) and the store scale that the last overflow grew to.
    """

    def __init__(
        self,
        experts: Sequence[Expert | tuple[LanguageModel, Prompt]],
        f: str | float | Ensemble = "product",
        weights: Sequence[float] | None = None,
        settings: SamplerSettings | None = None,
        *,
        mesh: Mesh | None = None,
        sharding_rules: str | ParamRules = "replicated",
        constraint: Automaton | Sequence[Automaton] | None = None,
        **options: Any,
    ):
        self.settings = (settings if settings is not None else DEFAULTS).replace(**options)
        self.experts = tuple(as_experts(experts))
        self.f = f
        self.weights = None if weights is None else tuple(float(w) for w in weights)
        if self.weights is not None and len(self.weights) != len(self.experts):
            raise ValueError(
                f"{len(self.weights)} weights given for K = {len(self.experts)} experts; pass one weight per "
                "expert (on the simplex), or none for uniform weights"
            )
        self.mesh = mesh
        self.sharding_rules = resolve_rules(sharding_rules)
        self.constraint = as_constraints(constraint)
        s = self.settings
        if mesh is not None:
            check_mesh(mesh, s.num_particles)
            if self.constraint:
                raise ValueError("constraints are not supported with a device mesh yet; run without mesh=")
        if s.level != "byte":
            first = self.experts[0].model
            for e in self.experts[1:]:
                if not _same_tokenizer(first, e.model):
                    raise ValueError(
                        f"level={s.level!r} needs experts that share one tokenizer, but {first.name} and "
                        f"{e.model.name} tokenize differently; use level='byte' to ensemble them exactly"
                    )
        if s.prompt_as_bytes and any(not isinstance(e.prompt, str) for e in self.experts):
            raise ValueError("prompt_as_bytes takes raw-text prompts (chat templates hold control tokens)")
        self._groups = _groups(list(self.experts))
        order = [i for _, idx in self._groups for i in idx]
        self._order = np.asarray(order)
        self._base_ensemble = make_ensemble(f, len(self.experts), None if self.weights is None else [self.weights[i] for i in order])
        self._ensemble = constrained(self._base_ensemble, len(self.constraint))
        self._constraint_experts: list = []
        self._smc = s.smc()
        self._capacity_scale = 1
        self._built: dict[int, Any] = {}
        self._arrays: dict[LanguageModel, tuple[Any, Any]] = {}
        self._vocab: list | None = None  # the shared tokens' byte strings (token-level constraints)

    def __repr__(self) -> str:
        experts = ", ".join(f"({e.model.name}, {e.prompt!r})" for e in self.experts)
        return f"EnsembleSampler(experts=[{experts}], f={self.f!r}, weights={self.weights!r}, {self.settings!r})"

    @property
    def ensemble(self) -> Ensemble:
        return self._ensemble

    @property
    def smc(self) -> SMC:
        return self._smc

    def _group(self, model: LanguageModel, prompts: list[Prompt], scale: int, prefilled: tuple | None = None,
               byte_width: int = 1):
        """The expert group of one model under `prompts` (prefilled now, or given as `prefilled`;
        raw-text prompts read as bytes are padded to at least `byte_width` bytes)."""
        prompt_bytes = prompt_lengths = None
        # The stores' path width is max_length's bucket: a new max_length within it reuses the programs.
        max_tokens = length_bucket(self.settings.max_length)
        if self.settings.prompt_as_bytes:
            # GenLM's convention: the model sees only BOS; the prompt's bytes go through the beam.
            bos = model.tokenizer.bos_token_id if model.tokenizer else None
            if bos is None:
                raise ValueError(f"{model.name} has no BOS token to start a byte-level prompt from")
            encoded = [p.encode("utf-8") for p in prompts]
            # Padded to a length bucket too: prompts of similar lengths share the programs.
            width = length_bucket(max(byte_width, max(len(b) for b in encoded), 1))
            prompt_bytes = np.zeros((len(encoded), width), np.int32)
            for i, b in enumerate(encoded):
                prompt_bytes[i, : len(b)] = list(b)
            prompt_lengths = jnp.asarray([len(b) for b in encoded], jnp.int32)
            prompt_bytes = jnp.asarray(prompt_bytes)
            max_tokens += prompt_bytes.shape[1]
            prefixes, logits = prefilled or prefill_prompts(model, [[bos]] * len(prompts), max_tokens, token_ids=True)
        else:
            prefixes, logits = prefilled or prefill_prompts(model, prompts, self.settings.max_length)
        paged, allowed = self._model_arrays(model)
        eos = tuple(model.tokenizer.eos_token_ids) if model.tokenizer else ()
        if not eos:
            raise ValueError(f"{model.name} has no end-of-sequence token; cannot end strings")
        m = self.settings.num_particles
        if self.settings.level == "byte":
            trie, _ = byte_vocabulary(model)
            # Starting capacities far below the worst case (1 + M C (1 + 2 D) contexts): a
            # particle's beam holds a few distinct contexts (continuing hypotheses share theirs)
            # plus the few extensions that pass the threshold, and its paths share all but their
            # last tokens. Each context holds a sum tree of the vocabulary (2 MB for Gemma 3), so
            # this matters; a run that overflows is rerun with doubled capacities.
            num_contexts = (1 + SAMPLER_CONTEXTS_PER_BEAM_SLOT * m * self.settings.beam_width) * scale
            prefetch_slots = self.settings.prefetch_slots * m
            prefetch_children = self.settings.prefetch_children * m
            if self.settings.prefetch:  # the prefetch cache keeps up to that many contexts alive
                num_contexts += (prefetch_slots + prefetch_children) * scale
            num_entries = (2 * m * (max_tokens + 1) + num_contexts) * scale
            experts = ByteExperts(
                model=paged,
                prefixes=prefixes,
                prompt_logits=logits,
                trie=trie,
                allowed=allowed,
                eos_ids=eos,
                beam=self.settings.beam(),
                max_tokens=max_tokens,
                temperature=np.float32(self.settings.temperature),
                num_entries=num_entries,
                num_contexts=num_contexts,
                prompt_bytes=prompt_bytes,
                prompt_lengths=prompt_lengths,
                prefetch_depth=self.settings.prefetch,
                prefetch_slots=prefetch_slots,
                prefetch_children=prefetch_children,
                prefetch_rows=self.settings.prefetch_rows,
                # One forward per call site reading M rows at a time, the last M / 2 if they fit
                # (a half-size forward): a smaller program than a forward per row bucket
                # (`row_buckets`), as fast warm. Prefetching fills a call's padded rows, so it
                # keeps the row buckets.
                row_chunk=0 if self.settings.prefetch or self.settings.row_buckets else m,
            )
            # Raw prompt bytes are read once per build by a program of their own. After a token
            # prompt the beams' first next-byte distributions need no model call (the prompt's
            # logits hold them): a run's first step computes them (`init_deferred`), so no start
            # program, which would hold the model's forward, is compiled.
            return experts.with_start_state(m) if prompt_bytes is not None else experts
        return TokenExperts(
            model=paged,
            prefixes=prefixes,
            prompt_logits=logits,
            eos_ids=eos,
            max_tokens=max_tokens,
            temperature=np.float32(self.settings.temperature),
        )

    def _model_arrays(self, model: LanguageModel) -> tuple[Any, Any]:
        """The model's paged form and, at the byte level, its mask of usable ids: made once per
        sampler, so every group of the model holds the same arrays (a batch of problems passes
        them once)."""
        if model not in self._arrays:
            allowed = jnp.asarray(byte_vocabulary(model)[1]) if self.settings.level == "byte" else None
            self._arrays[model] = (model.paged(), allowed)
        return self._arrays[model]

    def build(self, scale: int = 1):
        """The expert groups (one per model) as one expert group for the sampler (prompts are
        prefilled once per capacity scale and reused across seeds).

        Parameters
        ----------
        scale : int
            Multiplies the context stores' capacity (`grow_on_overflow` raises it).
        """
        if scale not in self._built:
            groups = [self._group(model, [self.experts[i].prompt for i in idx], scale) for model, idx in self._groups]
            groups += self.constraint_experts()
            built = groups[0] if len(groups) == 1 else ExpertStack(groups=tuple(groups))
            self._built.clear()
            self._built[scale] = built if self.mesh is None else shard_experts(built, self.mesh, self.sharding_rules)
        return self._built[scale]

    def constraint_experts(self) -> list:
        """The constraints read over the sampler's alphabet: bytes, or the experts' shared tokens
        (tables computed once per sampler)."""
        if not self._constraint_experts and self.constraint:
            self._constraint_experts.extend(self._read_constraints(self.constraint))
        return list(self._constraint_experts)

    def _read_constraints(self, automata: Sequence[Automaton]) -> list:
        """`automata` as experts over the sampler's alphabet (see `constraint_experts`)."""
        # Under a forced EOS, strings end by max_length: viability looks that far only.
        horizon = self.settings.max_length if self.settings.at_max_length == "eos" else NO_HORIZON
        if self.settings.level == "byte":
            return [c.byte_expert(horizon) for c in automata]
        model = self.experts[0].model
        if model.tokenizer is None:
            raise ValueError(f"{model.name} has no tokenizer, so a constraint cannot read its tokens")
        if self._vocab is None:  # read once per sampler: a batch reads one automaton per problem
            self._vocab = token_byte_strings(model.tokenizer.hf, vocab_size=model.config.vocab_size).byte_strings
        return [c.token_expert(self._vocab, horizon) for c in automata]

    def _decode(self) -> Callable[[np.ndarray], str]:
        if self.settings.level == "byte":
            return lambda symbols: bytes(int(s) for s in symbols).decode("utf-8", errors="replace")
        tok = self.experts[0].model.tokenizer
        return lambda symbols: tok.decode([int(s) for s in symbols])

    @property
    def capacity_scale(self) -> int:
        """The context-store scale runs use now (1, doubled each time a run overflowed)."""
        return self._capacity_scale

    def grow_on_overflow(self, run: Callable[[Any], Any]) -> Any:
        """`run(experts)`, rebuilt with a bigger context store while it raises an overflow error
        (the store only holds what is alive, so a larger one changes no result).

        Parameters
        ----------
        run : callable
            Called with the built expert group; its result is returned.
        """
        scale = self._capacity_scale
        while True:
            try:
                return run(self.build(scale))
            except ContextStoreOverflowError:
                if scale >= MAX_CAPACITY_SCALE:
                    raise
                scale *= CAPACITY_GROWTH
                self._capacity_scale = scale

    def __call__(self, seed: int | jax.Array = 0, *, allow_zero_weight: bool = False) -> SMCResult:
        """Samples once.

        Parameters
        ----------
        seed : int or jax.Array
            The seed, or a PRNG key.
        allow_zero_weight : bool
            Return the result even when every particle ends at zero weight (else `ZeroWeightError`).

        Returns
        -------
        SMCResult
            M weighted particles with decoded `texts`; `expert_logprobs` is [M, K] in the order of
            `experts`.
        """
        key = jax.random.key(seed) if isinstance(seed, int) else seed
        start = time.perf_counter()
        run = self._smc if self.mesh is None else partial(sample_sharded, self._smc, mesh=self.mesh, rules=self.sharding_rules)
        result = self.grow_on_overflow(
            lambda experts: run(key, experts, self._ensemble, decode=self._decode(), allow_zero_weight=allow_zero_weight))
        inverse = np.argsort(self._order)
        stats = dict(result.stats, seconds=time.perf_counter() - start, level=self.settings.level)
        # The constraints' columns (log C(x): 0, or -inf for particles that died) are dropped:
        # a particle's weight and `finished` flag already say whether it is in the language.
        models_logprobs = result.expert_logprobs[:, : len(self.experts)][:, inverse]
        return dataclasses.replace(result, expert_logprobs=models_logprobs, stats=stats)

    def sample_problems(
        self,
        prompts: Sequence[Sequence[Prompt]],
        seeds: int | Sequence[int] = 0,
        *,
        batch_size: int | None = None,
        constraints: Sequence[Automaton | Sequence[Automaton]] | None = None,
        allow_zero_weight: bool = False,
        mesh: Mesh | None = None,
    ) -> list[SMCResult | RuntimeError]:
        """Samples B problems in batches, each batch one program over a problem axis
        (`smc_jax.smc.batch`): problem b's experts are the sampler's models under `prompts[b]`
        (one prompt per expert, in the order of `experts`; the sampler's own prompts are not
        used), with its own seed. Each problem's result equals `__call__`'s for those prompts
        and seed up to the arithmetic of larger model calls (the same rows, padded more).

        Parameters
        ----------
        prompts : sequence of sequences of prompts
            B problems' prompts, K per problem.
        seeds : int or sequence of int
            One seed per problem, or one seed for every problem.
        batch_size : int, optional
            Problems per program (default: all). A short last batch is padded with copies of its
            first problem (dropped from the results), so every batch reuses one program.
        constraints : sequence, optional
            Per problem, its own automata (in place of the sampler's `constraint`; the same
            number for every problem), e.g. each instance's JSON schema. A batch's distinct
            automata share one table (`merge_constraints`), of one size for every batch.
        allow_zero_weight : bool
            Return a problem's result even when its particles all end at zero weight.
        mesh : jax.sharding.Mesh, optional
            A `smc_jax.smc.batch.problem_mesh`: each batch's problems are split over its
            "problems" axis (`batch_size` a multiple of its size) and each problem's particles
            over its "particles" axis (M a multiple of its size), possibly across processes.

        Returns
        -------
        list of SMCResult or RuntimeError
            Per problem, its result, or the error it ended in (`ZeroWeightError`, or a store's
            overflow that persisted at the largest capacity): one failed problem does not hide
            the others' results.
        """
        prompts = [list(p) for p in prompts]
        k = len(self.experts)
        for b, problem in enumerate(prompts):
            if len(problem) != k:
                raise ValueError(f"problem {b} has {len(problem)} prompts for K = {k} experts; give one prompt per expert")
        seeds = [int(seeds)] * len(prompts) if isinstance(seeds, (int, np.integer)) else [int(s) for s in seeds]
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} problems; give one seed per problem (or one int)")
        if self.mesh is not None:
            raise ValueError("a batch of problems takes its own mesh: build the EnsembleSampler without mesh= and "
                             "pass sample_problems(..., mesh=smc_jax.smc.batch.problem_mesh(...))")
        if constraints is not None:
            constraints = [as_constraints(c) for c in constraints]
            if len(constraints) != len(prompts) or len({len(c) for c in constraints}) > 1:
                raise ValueError(f"give every one of the {len(prompts)} problems the same number of constraints "
                                 f"(got {[len(c) for c in constraints]})")
        if not prompts:
            return []
        size = len(prompts) if batch_size is None else int(batch_size)
        if size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if mesh is not None:
            check_problem_mesh(mesh, size, self.settings.num_particles)
        chunks = [list(range(start, min(start + size, len(prompts)))) for start in range(0, len(prompts), size)]
        table_states = None
        if constraints is not None:  # every batch's merged tables get one size: one program for all
            table_states = [max(merged_states([constraints[b][i] for b in chunk]) for chunk in chunks)
                            for i in range(len(constraints[0]))]
        results: list[SMCResult | RuntimeError] = []
        for chunk in chunks:
            padded = chunk + [chunk[0]] * (size - len(chunk))
            results += self._sample_batch([prompts[i] for i in padded], [seeds[i] for i in padded],
                                          None if constraints is None else [constraints[i] for i in padded],
                                          allow_zero_weight, mesh, table_states)[: len(chunk)]
        return results

    def _sample_batch(self, prompts: list[list[Prompt]], seeds: list[int], constraints: list | None,
                      allow_zero_weight: bool, mesh: Mesh | None = None, table_states: list[int] | None = None) -> list:
        """One batch of `sample_problems`; problems that overflow their stores are run again, as
        a batch of their own, with grown capacities. `table_states`: per constraint, the rows of
        its merged table (`merge_constraints`)."""
        start = time.perf_counter()
        keys = jnp.stack([jax.random.key(seed) for seed in seeds])
        ensemble = self._ensemble if constraints is None else constrained(self._base_ensemble, len(constraints[0]))
        if constraints is not None:  # per constraint: each distinct automaton read once, one table for all
            columns = []
            for i in range(len(constraints[0])):
                distinct = {c[i].digest: c[i] for c in constraints}  # seeds repeat them; equal ones built apart too
                views = merge_constraints(self._read_constraints(list(distinct.values())),
                                          table_states and table_states[i])
                view_of = dict(zip(distinct, views))
                columns.append([view_of[c[i].digest] for c in constraints])
            constraints = [list(row) for row in zip(*columns)]
        results: list = [None] * len(prompts)
        todo, scale = list(range(len(prompts))), self._capacity_scale
        rows = 1 if mesh is None else mesh.shape[PROBLEMS]
        while todo:
            run = todo + todo[:1] * (-len(todo) % rows)  # a rerun too splits evenly over the mesh's rows
            groups = self._problem_groups([prompts[b] for b in run], scale,
                                          None if constraints is None else [constraints[b] for b in run])
            for b, result in zip(todo, sample_problems(self._smc, keys[np.asarray(run)], groups, ensemble,
                                                       decode=self._decode(), allow_zero_weight=allow_zero_weight,
                                                       mesh=mesh)):
                results[b] = result
            todo = [b for b in todo if isinstance(results[b], ContextStoreOverflowError)]
            if scale >= MAX_CAPACITY_SCALE:
                break
            scale *= CAPACITY_GROWTH
        seconds = time.perf_counter() - start
        inverse = np.argsort(self._order)
        return [r if not isinstance(r, SMCResult) else dataclasses.replace(
            r, expert_logprobs=r.expert_logprobs[:, : len(self.experts)][:, inverse],
            stats=dict(r.stats, seconds=seconds / len(prompts), batch_seconds=seconds, batch=len(prompts),
                       level=self.settings.level)) for r in results]

    def _problem_groups(self, prompts: list[list[Prompt]], scale: int, constraints: list | None = None) -> list:
        """Each problem's expert group; every model prefills all problems' prompts in one call,
        so they share one length bucket. `constraints`: each problem's constraint experts (else
        the sampler's)."""
        per_model = []
        for model, idx in self._groups:
            flat = [problem[i] for problem in prompts for i in idx]
            width = 1
            if self.settings.prompt_as_bytes:
                if any(not isinstance(p, str) for p in flat):
                    raise ValueError("prompt_as_bytes takes raw-text prompts (chat templates hold control tokens)")
                width = max(len(p.encode("utf-8")) for p in flat)
                prefilled = None
            else:  # each distinct prompt prefilled once (a problem's seeds repeat its prompts)
                distinct = list({repr(p): p for p in flat}.items())
                row_of = {key: row for row, (key, _) in enumerate(distinct)}
                prefixes, logits = prefill_prompts(model, [p for _, p in distinct], self.settings.max_length)
            groups = []
            for b in range(len(prompts)):
                if not self.settings.prompt_as_bytes:
                    rows = np.asarray([row_of[repr(prompts[b][i])] for i in idx])
                    prefilled = (jax.tree.map(lambda x: x[rows], prefixes), logits[rows])
                groups.append(self._group(model, [prompts[b][i] for i in idx], scale, prefilled, byte_width=width))
            per_model.append(groups)
        if constraints is None:
            constraints = [self.constraint_experts()] * len(prompts)
        return [[groups[b] for groups in per_model] + list(constraints[b]) for b in range(len(prompts))]

    def logprob(self, continuation: str | bytes) -> ByteLogprob:
        """Natural-log probabilities of `continuation` (UTF-8 when a str) after the prompt of the
        sampler's single byte-level expert: as a prefix, as a complete string (then EOS), per
        byte, and the next-byte distribution after it (see `ByteLogprob`).

        Parameters
        ----------
        continuation : str or bytes
            The string scored after the prompt.

        Returns
        -------
        ByteLogprob
            `.prefix`, `.complete` (floats), `.conditionals` [n] and `.next_logprobs` [257].
        """
        if self.settings.level != "byte" or len(self.experts) != 1:
            raise ValueError("logprob scores under one byte-level expert: EnsembleSampler(experts=(one,), level='byte')")
        data = continuation.encode() if isinstance(continuation, str) else bytes(continuation)
        if len(data) > self.settings.max_length:
            raise ValueError(f"the continuation has {len(data)} bytes, more than max_length={self.settings.max_length}; raise max_length")
        return self.grow_on_overflow(lambda experts: byte_logprob(experts, data))


def logprob(
    model: LanguageModel,
    continuation: str | bytes,
    prompt: Prompt = "",
    *,
    beam_width: int = DEFAULTS.beam_width,
    prune_threshold: float = DEFAULTS.prune_threshold,
    temperature: float = DEFAULTS.temperature,
    prompt_as_bytes: bool = DEFAULTS.prompt_as_bytes,
    heal: bool = DEFAULTS.heal,
) -> ByteLogprob:
    """log P(continuation | prompt) under `model` read as a byte-level LM (natural log).

    `.prefix` is exact (the sum over all tokenizations) when the beam never prunes
    (prune_threshold=0 and a beam wider than the tokenizations alive), a lower bound otherwise;
    `.complete` adds the end of string; `.healed` counts the bytes token healing rescued
    (`heal`, see `smc_jax.bytes.healing`). Compiled programs are cached per model and reused
    across prompts and continuations of similar lengths; for many pairs, `logprob_batch` scores
    several per program run (`smc_jax.scoring`). Defaults: `SamplerSettings`.

    Parameters
    ----------
    model : LanguageModel
        The model read as a byte-level LM.
    continuation : str or bytes
        The scored string (UTF-8 when a str).
    prompt : str or list of dict
        Raw text or chat messages before it ("" for none).
    beam_width : int
        Beam width B of the beam over tokenizations.
    prune_threshold : float
        Relative pruning threshold (0: no pruning).
    temperature : float
        Divides the model's logits.
    prompt_as_bytes : bool
        Read a raw-text prompt through the byte beam from BOS (GenLM's convention).

    heal : bool
        Token healing when a byte empties the beam (`smc_jax.bytes.healing`).

    Returns
    -------
    ByteLogprob
        `.prefix`, `.complete` (floats), `.conditionals` [n bytes], `.next_logprobs` [257]
        (index 256: EOS), `.healed` (bytes healed), `.model_calls` and `.rows` (the forwards
        made while reading it, and their rows).
    """
    scorer = scorer_for(model, beam_width=beam_width, prune_threshold=prune_threshold, temperature=temperature,
                        prompt_as_bytes=prompt_as_bytes, heal=heal)
    return scorer(continuation, prompt)


def sample(
    experts: Sequence[Expert | tuple[LanguageModel, Prompt]],
    f: str | float | Ensemble = "product",
    *,
    weights: Sequence[float] | None = None,
    level: Level = DEFAULTS.level,
    num_particles: int = DEFAULTS.num_particles,
    ess_threshold: float = DEFAULTS.ess_threshold,
    resampler: str = DEFAULTS.resampler,
    max_length: int = DEFAULTS.max_length,
    temperature: float = DEFAULTS.temperature,
    seed: int | jax.Array = 0,
    beam_width: int = DEFAULTS.beam_width,
    prune_threshold: float = DEFAULTS.prune_threshold,
    at_max_length: str = DEFAULTS.at_max_length,
    prompt_as_bytes: bool = DEFAULTS.prompt_as_bytes,
    heal: bool = DEFAULTS.heal,
    resample_finished: bool = DEFAULTS.resample_finished,
    allow_zero_weight: bool = False,
    mesh: Mesh | None = None,
    sharding_rules: str | ParamRules = "replicated",
    constraint: Automaton | Sequence[Automaton] | None = None,
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
    constraint: one or more automata from `smc_jax.constraints` (`regex`, `json_schema`), each a
    separate factor of the target, Phi(x) ∝ f_w(p_1(x), ..., p_K(x)) * prod_j C_j(x) (the weights
    stay on the models; with level="local" this is locally constrained decoding).
    Every default is `smc_jax.settings.DEFAULTS`' (see `SamplerSettings` for why).

    Parameters
    ----------
    experts : sequence of Expert or (LanguageModel, prompt) pairs
        The K experts; a prompt is raw text or chat messages.
    f : str, float or Ensemble
        "min", "harmonic", "product", "mixture" / "sum", "quadratic", "max", an exponent tau, or
        an `Ensemble` (`smc_jax.smc.ensemble`).
    weights : sequence of float, optional
        K expert weights on the simplex (uniform by default).
    level : {"token", "byte", "local"}
        Symbols are tokens (experts share a tokenizer), bytes, or the token-local baseline.
    num_particles : int
        M.
    ess_threshold : float
        Resample when ESS < ess_threshold * M (0: importance sampling).
    resampler : str
        "multinomial", "systematic", "stratified" or "residual".
    max_length : int
        L, in symbols (tokens or bytes).
    temperature : float
        Divides every model's logits.
    seed : int or jax.Array
        The seed, or a PRNG key.
    beam_width, prune_threshold : int, float
        The byte level's beam over tokenizations.
    at_max_length : {"eos", "truncate"}
        Force EOS at L (target: Phi on strings of at most L symbols) or stop without it.
    prompt_as_bytes : bool
        Read raw-text prompts through the byte beam from BOS.
    heal : bool
        Byte level: token healing when a byte empties a beam (`smc_jax.bytes.healing`).
    resample_finished : bool
        False: resample only the particles still extending.
    allow_zero_weight : bool
        Return the result even when every particle ends at zero weight.
    constraint : Automaton or sequence of Automaton, optional
        Hard constraints from `smc_jax.constraints`, each a separate 0/1 factor of the target.
    mesh : jax.sharding.Mesh, optional
        Split the particles over this mesh's "particles" axis (`smc_jax.smc.sharding.make_mesh`).
    sharding_rules : str or tuple
        Model weights on the mesh's "model" axis: "replicated", "tensor_parallel" or a rule table.

    Returns
    -------
    SMCResult
        M weighted particles with decoded `texts`, `log_Z` and diagnostics.
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
        heal=heal,
        resample_finished=resample_finished,
        mesh=mesh,
        sharding_rules=sharding_rules,
        constraint=constraint,
    )
    return sampler(seed, allow_zero_weight=allow_zero_weight)
