"""Where the time of one byte-level model call goes (issue 18, item 3).

A byte-SMC step that needs new token contexts makes one *model call*:
`smc_jax.models.contexts.extend_group`, as `ByteExperts._create` sends it. Its requests
(parent context, token) are deduplicated, the rows are fed through the transformer over the
paged KV pool, each row's logits become a byte-level summary (`smc_jax.bytes.beam.summarize_logits`:
log-softmax over the byte tokens and EOS, the logits in trie order, their log-space sum tree,
the root's 256 child masses), and the new keys/values and summaries are written into the
context store. This script times that call on the shapes the byte-SMC workloads of
`compare_genlm.py` use (M = 10 particles, beam width 5, threshold 0.05, the prompt read as bytes
after BOS, 39 bytes + EOS: paths of 63 tokens, a store of 151 contexts and 1,431 pool entries)
and, separately jitted on the same shapes, each of its parts:

* call: the whole `extend_group` (the store donated, so its writes are in place as inside the
  sampler's loop), with one bucket of `rows` rows, `rows` valid unique requests among the
  M * (C D + H D) requests of a shift with look-ahead (`ByteExperts._advance`);
* a: forward = `paged_decode` (embedding, the layers with their pool gathers, final norm, LM
  head); a2: the LM head alone (`output_logits`: final norm, h @ E^T in f32, soft-cap);
  a1 = a - a2 (the layers, derived);
* b: log-softmax = the masked, tempered log-softmax over the vocabulary (the first two lines of
  `summarize_logits`);
* summarize = `summarize_logits` itself (b and c, one program); c = summarize - b (derived), and
  its pieces c1: the gather into trie order (`TokenTrie.sort_logprobs`), c2: `build_sum_tree`,
  c3: the root's child masses (`next_byte_logmass` at the root, per row);
* d: other = the call with the forward and the summaries replaced by given outputs (a stub
  model that writes given keys/values into the pool as `PagedTransformer.step` does): the
  deduplication, liveness and free-slot search, path gathers, the bucket's loop, the pool and
  table writes; and its pieces d1: the pool write of the rows' keys/values, d2: the write of the
  rows' summaries into the store's table (both donated, in place); residual = call - a - (b+c) - d
  (derived: what the separate programs do not add up to, e.g. fusion across parts, and noise);
* e: the forward with other weight formats, all on XLA:CPU: bf16 weights upcast to f32 in the
  program (f32 activations and accumulation: only the stored format changes), int8 weights with
  a per-output-channel f32 scale upcast likewise, the library's own bf16 model
  (`LanguageModel.astype(jnp.bfloat16)`: bf16 weights, activations and pool; f32 logits and
  attention softmax), bf16 matmuls under f32 activations (`LanguageModel.with_matmul_dtype`:
  bf16 weights and products' inputs, f32 accumulation, activations and pool), and f32 with the other layer-weight layout ("layout": stacked on a layer
  axis when the model's are split, as `load_model` gives on CPU, else split). For each, the
  largest |difference| of the rows' log-probs (the masked log-softmax) from the f32 model's,
  over all allowed tokens and over those with f32 log-prob above -10.

* f (`--ops`): the forward's XLA operations, timed from a profiler trace (XLA:CPU's per-thunk
  TraceMe events, `--xla_cpu_enable_xprof_traceme`): milliseconds per call of each operation and
  of four kinds: the per-layer slices a `lax.scan` over stacked weights copies out of them
  (`dynamic_index_in_dim`), the weight matmuls (einsums named in the metadata), the KV-pool
  gathers, and everything else (attention's own dots, norms, RoPE, softmax). Thunks run
  concurrently on the CPU's threads, so the kinds can add up to more than the forward's wall time.

Every part is compiled ahead of time (compile seconds reported separately, never timed), run
once as warm-up, then timed `repeats` times with `jax.block_until_ready`: the median and
min/max in milliseconds. The parts are separate programs, so they need not add up to the call
exactly (XLA fuses across them inside it); "derived" rows are differences of medians. The load
average is recorded before and after each model (the timings mean little under load).

Run: python -m benchmarks.bench_call_profile [--models smollm2-135m-instruct gemma3-270m]
     [--rows 5 10] [--repeats 20] [--experts 1] [--variants bf16_upcast int8_upcast bf16 bf16_matmul layout]
     [--ops] [--name bench_call_profile]
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import markdown_table, save
from smc_jax.bytes.beam import BeamConfig, summarize_logits
from smc_jax.bytes.sumtree import SumTree, build_sum_tree
from smc_jax.bytes.trie import ROOT, TokenTrie, next_byte_logmass
from smc_jax.experts.byte import ByteExperts
from smc_jax.models.contexts import NO_CONTEXT, PROMPT_CONTEXT, context_tokens_path, extend_group
from smc_jax.models.params import cast, cast_matmuls, is_matmul_weight, is_split, stack_layers, unstack_layers
from smc_jax.models.paged import KVPool, PagedTransformer, paged_decode
from smc_jax.models.transformer import output_logits

SMOLLM2, GEMMA3 = "smollm2-135m-instruct", "gemma3-270m"
MODELS = (SMOLLM2, GEMMA3)
#: The byte-SMC workloads of compare_genlm.py / bench_calls.py.
PROMPT = "My favorite physicist is"
NUM_PARTICLES = 10
BEAM_WIDTH = 5
PRUNE_THRESHOLD = 0.05
MAX_LENGTH = 39
#: Rows per call: bucket_sizes(.., typical=M) gives buckets M/2, M, 2M (and the worst case); the
#: byte workloads average ~5.5-6 rows per store and call (benchmarks/results/bench_calls_idle.md).
DEFAULT_ROWS = (5, 10)
VARIANTS = ("bf16_upcast", "int8_upcast", "bf16", "bf16_matmul", "layout")
#: Tokens with an f32 log-prob above this count for the "top" log-prob difference.
TOP_LOGP = -10.0
COLUMNS = ["model", "rows", "part", "kind", "median_ms", "min_ms", "max_ms", "pct_of_call", "compile_s",
           "max_abs_dlogp", "max_abs_dlogp_top"]
OP_COLUMNS = ["model", "rows", "op_kind", "ms_per_call", "pct_of_forward_wall", "ops", "largest"]
TRACEME_FLAG = "--xla_cpu_enable_xprof_traceme=true"
#: Operations that only contain others (their time is their children's).
_CONTAINERS = ("while", "call", "conditional", "tuple", "get-tuple-element", "parameter", "constant", "bitcast")


# ---------------------------------------------------------------------------------------------
# The experts and one call's inputs


def byte_experts(model: Any, prompts: Sequence[str], num_particles: int = NUM_PARTICLES,
                 max_length: int = MAX_LENGTH, beam_width: int = BEAM_WIDTH,
                 prune_threshold: float = PRUNE_THRESHOLD) -> ByteExperts:
    """K byte-level experts of one loaded model as the sampler builds them for the byte-SMC
    workloads (`EnsembleSampler._group`: level="byte", prompt_as_bytes=True, capacity scale 1),
    without the start state (the prompt's own calls are not what is profiled)."""
    from smc_jax.api import CONTEXTS_PER_BEAM_SLOT, byte_vocabulary, prefill_prompts

    encoded = [p.encode("utf-8") for p in prompts]
    prompt_bytes = np.zeros((len(encoded), max(1, max(len(b) for b in encoded))), np.int32)
    for i, b in enumerate(encoded):
        prompt_bytes[i, : len(b)] = list(b)
    max_tokens = max_length + prompt_bytes.shape[1]
    prefixes, logits = prefill_prompts(model, [[model.tokenizer.bos_token_id]] * len(prompts), max_tokens,
                                       token_ids=True)
    trie, allowed = byte_vocabulary(model)
    num_contexts = 1 + CONTEXTS_PER_BEAM_SLOT * num_particles * beam_width
    return ByteExperts(
        model=model.paged(), prefixes=prefixes, prompt_logits=logits, trie=trie, allowed=jnp.asarray(allowed),
        eos_ids=tuple(model.tokenizer.eos_token_ids), beam=BeamConfig(width=beam_width, threshold=prune_threshold),
        max_tokens=max_tokens, num_entries=2 * num_particles * (max_tokens + 1) + num_contexts,
        num_contexts=num_contexts, prompt_bytes=jnp.asarray(prompt_bytes),
        prompt_lengths=jnp.asarray([len(b) for b in encoded], jnp.int32),
    )


@functools.partial(jax.jit, static_argnums=(1, 2))
def call_inputs(experts: ByteExperts, num_particles: int, rows: int) -> dict[str, Any]:
    """One call's arguments (leaves [K, ...]): requests as wide as a shift with look-ahead sends
    them (M (C D + H D), H = C + C D), the first `rows` valid and unique (the prompt context
    extended by its `rows` most likely tokens), the beams' contexts to keep, a fresh store."""
    m, c, d = num_particles, experts.num_slots, experts.trie.max_duplicates
    k = experts.num_experts
    width = m * (c * d + (c + c * d) * d)
    masked = jnp.where(experts.allowed, experts.prompt_logits, -jnp.inf)
    top = jax.lax.top_k(masked, rows)[1].astype(jnp.int32)  # [K, rows]
    token = jnp.zeros((k, width), jnp.int32).at[:, :rows].set(top)
    keep = jnp.full((k, m * c * (1 + d)), NO_CONTEXT, jnp.int32).at[:, 0].set(PROMPT_CONTEXT)
    return dict(
        stores=experts.init_stores(num_particles),
        parent=jnp.full((k, width), PROMPT_CONTEXT, jnp.int32),
        token=token,
        valid=jnp.broadcast_to(jnp.arange(width) < rows, (k, width)),
        keep=keep,
    )


def summarize_fn(experts: ByteExperts) -> Callable[[jax.Array], Any]:
    return functools.partial(summarize_logits, trie=experts.trie, allowed=experts.allowed, eos_ids=experts.eos_ids,
                             temperature=experts.temperature)


# ---------------------------------------------------------------------------------------------
# The parts, each a function of pytrees only (compiled separately)


def whole_call(experts: ByteExperts, stores, parent, token, valid, keep, rows: int):
    """The call as the sampler makes it, with one bucket of `rows` rows."""
    return extend_group(stores, experts.model, experts.prefixes, parent, token, valid, keep,
                        summarize_fn(experts), (rows,))


class _StubModel:
    """A `PagedModel` whose step returns given keys/values (written to the pool as
    `PagedTransformer.step` writes them) and a dummy [rows, 1] logits array: the call without the
    transformer."""

    def __init__(self, k, v):
        self.k, self.v = k, v

    def step(self, prefix, pool, paths, depth, tokens, write_at, span=None):
        logits = jnp.zeros((tokens.shape[0], 1), jnp.float32)
        return logits, KVPool(k=pool.k.at[:, write_at].set(self.k.astype(pool.k.dtype), mode="drop"),
                              v=pool.v.at[:, write_at].set(self.v.astype(pool.v.dtype), mode="drop"))


def call_without_model(experts: ByteExperts, stores, parent, token, valid, keep, k, v, summary, rows: int):
    """The call with the forward replaced by given keys/values (one row set, [layers, rows, kvh,
    hd], shared by the K experts) and the summaries by given ones ([rows, ...]): what is left is
    part d, measured (deduplication, liveness and free slots, path gathers, pool and table writes)."""
    return extend_group(stores, _StubModel(k, v), experts.prefixes, parent, token, valid, keep,
                        lambda logits: summary, (rows,))


def forward_inputs(inputs: dict[str, Any], rows: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The forward's paths, depth and tokens for the first `rows` rows of `call_inputs`."""
    paths, depth = jax.jit(jax.vmap(context_tokens_path))(inputs["stores"], inputs["parent"][:, :rows])
    return paths, depth, inputs["token"][:, :rows]


def forward(model: PagedTransformer, prefixes, pools: KVPool, paths, depth, tokens):
    """paged_decode over the K experts (vmapped as in extend_group): logits, new keys, values."""
    return jax.vmap(lambda prefix, pool, p, dp, t: paged_decode(model.params, model.config, prefix, pool, p, dp, t))(
        prefixes, pools, paths, depth, tokens)


def lm_head(model: PagedTransformer, hidden):
    return output_logits(model.params, model.config, hidden)


def masked_log_softmax(logits, allowed, temperature: float):
    """The first two lines of summarize_logits."""
    logits = jnp.where(allowed, logits.astype(jnp.float32) / temperature, -jnp.inf)
    return jax.nn.log_softmax(logits, axis=-1)


def summarize(experts: ByteExperts, logits):
    return jax.vmap(summarize_fn(experts))(logits)


def sort_logprobs(trie: TokenTrie, logp):
    return trie.sort_logprobs(logp)


def root_children(trie: TokenTrie, cells):
    """The root's 256 child masses of every row's tree (cells [rows, 2P])."""
    tree = SumTree(cells, cells.shape[-1] // 2)
    return jax.vmap(lambda row: next_byte_logmass(trie, tree, ROOT, row))(jnp.arange(cells.shape[0]))


def pool_write(pools: KVPool, k, v, write_at):
    """PagedTransformer.step's write of the rows' keys/values (vmapped over the K pools)."""
    return jax.vmap(lambda pool, kk, vv, at: KVPool(pool.k.at[:, at].set(kk.astype(pool.k.dtype), mode="drop"),
                                                    pool.v.at[:, at].set(vv.astype(pool.v.dtype), mode="drop")))(
        pools, k, v, write_at)


def summary_write(table, new, write_ctx):
    """extend_contexts' write of the rows' summaries into the store's table."""
    return jax.vmap(lambda t, n, at: jax.tree.map(lambda a, b: a.at[at].set(b, mode="drop"), t, n))(
        table, new, write_ctx)


# ---------------------------------------------------------------------------------------------
# Weight formats


@functools.partial(jax.jit, static_argnums=1)
def _quantize(w, axis: int):
    scale = jnp.max(jnp.abs(w.astype(jnp.float32)), axis=axis, keepdims=True) / 127.0
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8), scale


class Int8(NamedTuple):
    """An int8 matrix and its per-row f32 scale."""

    q: jax.Array
    scale: jax.Array


def quantize_int8(params):
    """Symmetric int8 per output channel for the matrices (kernels [.., out, in] and embed /
    lm_head [V, D]: one scale per row), the rest (norms, biases) kept as is; stacked or split
    layers alike."""
    return jax.tree_util.tree_map_with_path(lambda path, w: Int8(*_quantize(w, -1)) if is_matmul_weight(path, w) else w,
                                            params)


def dequantize_int8(stored):
    return jax.tree_util.tree_map(lambda w: w.q.astype(jnp.float32) * w.scale if isinstance(w, Int8) else w,
                                  stored, is_leaf=lambda w: isinstance(w, Int8))


def upcast_forward(config, decode_params: Callable, stored, prefixes, pools, paths, depth, tokens):
    """The forward with the weights stored in another format, turned into f32 inside the program."""
    model = PagedTransformer(params=decode_params(stored), config=config)
    return forward(model, prefixes, pools, paths, depth, tokens)


def to_f32(params):
    return cast(params, jnp.float32)


# ---------------------------------------------------------------------------------------------
# Timing


def compile_and_time(fn: Callable, args: tuple, repeats: int, donate: int | None = None,
                     static: dict | None = None) -> tuple[dict[str, float], Any]:
    """Compiles fn(*args) ahead of time (timed apart), runs it once (warm-up), then `repeats`
    times, each blocked until done. With `donate`, that argument is donated and each run's first
    output replaces it (steady state, in place). Returns the timing and the last output."""
    jitted = jax.jit(functools.partial(fn, **(static or {})), donate_argnums=() if donate is None else (donate,))
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - start
    args = list(args)

    def run():
        out = jax.block_until_ready(compiled(*args))
        if donate is not None:
            args[donate] = out[0] if isinstance(out, tuple) else out
        return out

    out = run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    ms = [1e3 * t for t in times]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "compile_s": compile_s,
            "times_ms": [round(t, 3) for t in ms]}, out


_HLO_LINE = re.compile(r"^\s*(?:ROOT\s+)?%([^\s=]+) = (\S+)\s+([\w-]+)\(")


def hlo_ops(hlo_text: str) -> dict[str, dict[str, str]]:
    """Instruction name -> its shape, opcode and metadata op_name, from a compiled module's text."""
    ops = {}
    for line in hlo_text.splitlines():
        m = _HLO_LINE.match(line)
        if m:
            op_name = re.search(r'op_name="([^"]*)"', line)
            ops[m.group(1)] = {"shape": m.group(2).split("{")[0], "opcode": m.group(3),
                               "op_name": op_name.group(1) if op_name else ""}
    return ops


def op_kind(op: dict[str, str]) -> str:
    """One of four kinds, from the op's metadata (see the module docstring, part f)."""
    name = op["op_name"]
    if "dynamic_index_in_dim" in name:
        return "per-layer slices of stacked arrays (lax.scan)"
    if "dot_general" in name and "->" in name:
        return "weight matmuls (named einsums, LM head)"
    if "gather" in name:
        return "KV-pool gathers"
    return "other (attention dots, norms, RoPE, softmax, ...)"


def trace_ops(fn: Callable, args: tuple, repeats: int) -> tuple[dict[str, float], dict[str, dict[str, str]], float]:
    """Runs fn(*args) `repeats` times under the profiler. Returns milliseconds per call of each
    XLA operation (its TraceMe events), the module's ops, and the median wall milliseconds."""
    compiled = jax.jit(fn).lower(*args).compile()
    ops = hlo_ops(compiled.as_text())
    for _ in range(2):
        jax.block_until_ready(compiled(*args))
    walls = []
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory, create_perfetto_trace=True):
            for _ in range(repeats):
                start = time.perf_counter()
                jax.block_until_ready(compiled(*args))
                walls.append(1e3 * (time.perf_counter() - start))
        files = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
        if not files:
            raise RuntimeError("the profiler wrote no perfetto trace")
        with gzip.open(files[0]) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    per_op: dict[str, float] = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name in ops and ops[name]["opcode"] not in _CONTAINERS:
            per_op[name] += e.get("dur", 0) / 1e3 / repeats
    if not per_op:
        raise RuntimeError(f"no per-operation events in the trace: set XLA_FLAGS={TRACEME_FLAG} before JAX starts")
    return dict(per_op), ops, statistics.median(walls)


def op_rows(experts: ByteExperts, model_name: str, rows: int, repeats: int,
            num_particles: int = NUM_PARTICLES) -> list[dict[str, Any]]:
    """Part f: the forward's operations by kind, milliseconds per call."""
    inputs = call_inputs(experts, num_particles, rows)
    paths, depth, tokens = forward_inputs(inputs, rows)
    per_op, ops, wall = trace_ops(forward, (experts.model, experts.prefixes, inputs["stores"].pool, paths, depth, tokens),
                                  repeats)
    kinds: dict[str, list[str]] = collections.defaultdict(list)
    for name in sorted(per_op, key=per_op.get, reverse=True):
        kinds[op_kind(ops[name])].append(name)
    totals = {kind: sum(per_op[n] for n in names) for kind, names in kinds.items()}
    table = [{"model": model_name, "rows": rows, "op_kind": "forward (wall, median)", "ms_per_call": wall,
              "pct_of_forward_wall": 100.0, "ops": "", "largest": ""}]
    for kind in sorted(totals, key=totals.get, reverse=True):
        top = kinds[kind][0]
        table.append({"model": model_name, "rows": rows, "op_kind": kind, "ms_per_call": totals[kind],
                      "pct_of_forward_wall": 100.0 * totals[kind] / wall, "ops": len(kinds[kind]),
                      "largest": f"{top} {ops[top]['shape']} {per_op[top]:.2f} ms"})
    return table


def _copy(tree):
    """A fresh copy of a pytree's arrays (what a donated argument consumes)."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


def _log_softmax64(logits, allowed) -> np.ndarray:
    x = np.where(allowed, np.asarray(logits, np.float64), -np.inf)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.sum(np.exp(x - top), axis=-1, keepdims=True))


def logp_difference(reference, other, allowed) -> dict[str, float]:
    """max |log p - log p_ref| (masked log-softmax, in float64) over the allowed tokens, and over
    those with log p_ref > TOP_LOGP."""
    allowed = np.asarray(allowed)
    ref, got = _log_softmax64(reference, allowed), _log_softmax64(other, allowed)
    mask = np.broadcast_to(allowed, ref.shape)
    diff = np.zeros(ref.shape)
    diff[mask] = np.abs(got[mask] - ref[mask])
    return {"max_abs_dlogp": float(diff.max()), "max_abs_dlogp_top": float(diff[mask & (ref > TOP_LOGP)].max())}


def profile(experts: ByteExperts, model_name: str, rows: int, repeats: int, num_particles: int = NUM_PARTICLES,
            variants: Sequence[str] = VARIANTS, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The table rows of one model and row count: measured parts, derived parts, weight formats."""
    if not isinstance(experts.model, PagedTransformer):
        raise TypeError("the profile needs a PagedTransformer (a ported model), not a Flax model")
    model = experts.model
    inputs = call_inputs(experts, num_particles, rows)
    stores = inputs["stores"]
    k = experts.num_experts
    paths, depth, tokens = forward_inputs(inputs, rows)
    out: dict[str, dict[str, Any]] = {}

    def measure(part: str, fn, args, **options):
        timing, result = compile_and_time(fn, args, repeats, **options)
        out[part] = timing
        log(f"{model_name} rows={rows} {part}: {timing['median_ms']:.2f} ms (compile {timing['compile_s']:.1f} s)")
        return result

    measure("call", whole_call, (experts, _copy(stores), inputs["parent"], inputs["token"], inputs["valid"],
                                 inputs["keep"]), donate=1, static={"rows": rows})
    logits, new_k, new_v = measure("forward", forward, (model, experts.prefixes, stores.pool, paths, depth, tokens))
    hidden = jax.random.normal(jax.random.key(0), (k, rows, model.config.hidden_size), model.dtype)
    measure("lm_head", lm_head, (model, hidden))
    measure("log_softmax", masked_log_softmax, (logits, experts.allowed), static={"temperature": experts.temperature})
    summaries = measure("summarize", summarize, (experts, logits))
    logp = masked_log_softmax(logits, experts.allowed, experts.temperature)
    sorted_logp = measure("sort", sort_logprobs, (experts.trie, logp))
    tree = measure("sum_tree", build_sum_tree, (sorted_logp,))
    measure("root_children", root_children, (experts.trie, tree.cells.reshape(k * rows, -1)))
    write_at = jnp.broadcast_to(jnp.arange(rows, dtype=jnp.int32), (k, rows))
    first_summaries = jax.tree.map(lambda x: x[0], summaries)  # expert 0's rows serve every expert
    measure("other", call_without_model, (experts, _copy(stores), inputs["parent"], inputs["token"], inputs["valid"],
                                          inputs["keep"], new_k[0], new_v[0], first_summaries),
            donate=1, static={"rows": rows})
    measure("pool_write", pool_write, (_copy(stores.pool), new_k, new_v, write_at), donate=0)
    measure("summary_write", summary_write, (_copy(stores.summary), summaries, write_at + 1), donate=0)

    f32_logits = np.asarray(logits)
    formats: dict[str, tuple] = {}
    if "bf16_upcast" in variants:
        formats["bf16_upcast"] = (functools.partial(upcast_forward, model.config, to_f32),
                                  (cast(model.params, jnp.bfloat16), experts.prefixes, stores.pool, paths, depth, tokens))
    if "int8_upcast" in variants:
        formats["int8_upcast"] = (functools.partial(upcast_forward, model.config, dequantize_int8),
                                  (quantize_int8(model.params), experts.prefixes, stores.pool, paths, depth, tokens))
    if "bf16" in variants:
        half = PagedTransformer(params=cast(model.params, jnp.bfloat16), config=model.config)
        prefixes = experts.prefixes.replace(k=experts.prefixes.k.astype(jnp.bfloat16),
                                            v=experts.prefixes.v.astype(jnp.bfloat16))
        formats["bf16"] = (forward, (half, prefixes, cast(stores.pool, jnp.bfloat16), paths, depth, tokens))
    if "bf16_matmul" in variants:
        mixed = PagedTransformer(params=cast_matmuls(model.params, jnp.bfloat16), config=model.config)
        formats["bf16_matmul"] = (forward, (mixed, experts.prefixes, stores.pool, paths, depth, tokens))
    if "layout" in variants:
        other_layout = stack_layers if is_split(model.params) else unstack_layers
        other = PagedTransformer(params=other_layout(model.params), config=model.config)
        formats["layout"] = (forward, (other, experts.prefixes, stores.pool, paths, depth, tokens))
    for name, (fn, args) in formats.items():
        result = measure(f"forward_{name}", fn, args)
        out[f"forward_{name}"].update(logp_difference(f32_logits, result[0], experts.allowed))
        del result

    return table_rows(out, model_name, rows)


#: (part key, label, kind, how it is derived) in table order.
LABELS = (
    ("call", "call (extend_group)", "measured"),
    ("forward", "a: forward (paged_decode)", "measured"),
    ("layers", "a1: layers = a - a2", "derived"),
    ("lm_head", "a2: LM head (output_logits)", "measured"),
    ("log_softmax", "b: log-softmax", "measured"),
    ("summarize", "b+c: summarize_logits", "measured"),
    ("tree", "c: byte structures = summarize - b", "derived"),
    ("sort", "c1: trie-order gather", "measured"),
    ("sum_tree", "c2: sum-tree build", "measured"),
    ("root_children", "c3: root child masses", "measured"),
    ("other", "d: other (call without a, b, c)", "measured"),
    ("residual", "call - a - (b+c) - d", "derived"),
    ("pool_write", "d1: KV pool write", "measured"),
    ("summary_write", "d2: summary-table write", "measured"),
    ("forward_bf16_upcast", "e: forward, bf16 weights -> f32", "measured"),
    ("forward_int8_upcast", "e: forward, int8 weights -> f32", "measured"),
    ("forward_bf16", "e: forward, bf16 model (astype)", "measured"),
    ("forward_bf16_matmul", "e: forward, bf16 matmuls, f32 activations", "measured"),
    ("forward_layout", "e: forward, f32, the other layer layout", "measured"),
)


def table_rows(out: dict[str, dict[str, Any]], model_name: str, rows: int) -> list[dict[str, Any]]:
    med = {part: timing["median_ms"] for part, timing in out.items()}
    derived = {
        "layers": med["forward"] - med["lm_head"],
        "tree": med["summarize"] - med["log_softmax"],
        "residual": med["call"] - med["forward"] - med["summarize"] - med["other"],
    }
    table = []
    for part, label, kind in LABELS:
        if part not in out and part not in derived:
            continue
        row = {"model": model_name, "rows": rows, "part": label, "key": part, "kind": kind}
        if kind == "derived":
            row["median_ms"] = derived[part]
        else:
            row.update(out[part])
        row["pct_of_call"] = 100.0 * row["median_ms"] / med["call"]
        table.append(row)
    return table


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--rows", nargs="+", type=int, default=list(DEFAULT_ROWS),
                        help="rows per call (the bucket size); the byte workloads use 5, 10, 20")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--experts", type=int, default=1,
                        help="K prompts of the model in one call (2: SmolLM2 x 2 prompts)")
    parser.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(VARIANTS),
                        help="weight formats of the forward (e); none: skip")
    parser.add_argument("--ops", action="store_true",
                        help="also part f: the forward's XLA operations by kind, from a profiler trace")
    parser.add_argument("--name", default="bench_call_profile")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.experts < 1 or min(args.rows) < 1:
        parser.error("--repeats, --experts and --rows must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.ops and TRACEME_FLAG not in os.environ.get("XLA_FLAGS", ""):
        # Read when the CPU backend starts (the first array below), not at import.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + TRACEME_FLAG).strip()
    from smc_jax import load_model

    load: dict[str, Any] = {"before": os.getloadavg()}
    rows, ops = [], []
    for name in args.models:
        model = load_model(name)
        experts = byte_experts(model, [PROMPT] * args.experts)
        for r in args.rows:
            rows += profile(experts, name, r, args.repeats, variants=args.variants)
            if args.ops:
                ops += op_rows(experts, name, r, args.repeats)
        load[f"after_{name}"] = os.getloadavg()
        del model, experts
    notes = (
        f"One byte-level model call (`extend_group`) and its parts, each jitted separately on the shapes of "
        f"compare_genlm's byte-SMC workloads (M={NUM_PARTICLES}, beam {BEAM_WIDTH} / {PRUNE_THRESHOLD}, "
        f"{MAX_LENGTH} bytes + EOS, prompt read as bytes), K={args.experts} prompt(s) per call, `rows` rows. "
        f"Median (min/max) of {args.repeats} runs after a warm-up, milliseconds; compile seconds apart. "
        "Derived rows are differences of medians; parts are separate programs, so they need not add up. "
        "max_abs_dlogp: largest |log-prob difference| from the f32 model over allowed tokens (top: those with "
        f"f32 log-prob > {TOP_LOGP}). Load average before/after in the settings: timings under load are rough."
    )
    appendix = ""
    if ops:
        appendix = ("## f: the forward's XLA operations by kind (profiler trace; milliseconds per call)\n\n"
                    "Summed thunk times: thunks run concurrently on the CPU's threads, so the kinds can add up to "
                    "more than the wall time.\n\n" + markdown_table(ops, OP_COLUMNS))
    table = save(args.name, rows, COLUMNS, {"repeats": args.repeats, "rows": args.rows, "experts": args.experts,
                                            "num_particles": NUM_PARTICLES, "variants": args.variants,
                                            "ops": args.ops, "load_average": load}, notes, appendix=appendix)
    print(table + ("\n\n" + appendix if appendix else ""))


if __name__ == "__main__":
    main()
