"""benchmarks.bench_call_profile on a tiny random model (the real models: the benchmark run itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import bench_call_profile as bcp
from benchmarks.common import markdown_table
from smc_jax.bytes.beam import BeamConfig
from smc_jax.bytes.trie import TokenTrie
from smc_jax.experts.byte import ByteExperts
from smc_jax.models.config import ModelConfig
from smc_jax.models.lm import prefill_many
from smc_jax.models.paged import PagedTransformer
from smc_jax.models.params import random_params, unstack_layers

BYTE_VOCAB = [b"a", b"b", b"ab", b"ba", b"aba", b" ", b"a ", None]  # None: EOS (no bytes)


def tiny_experts(num_experts: int = 1) -> ByteExperts:
    config = ModelConfig(
        architecture="llama", vocab_size=len(BYTE_VOCAB), hidden_size=16, intermediate_size=32, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=4, max_positions=64,
    )
    model = PagedTransformer(params=random_params(config, jax.random.key(0)), config=config)
    padded = jnp.asarray([[0, 1, 2, 0]] * num_experts, jnp.int32)
    prefixes, logits = prefill_many(model.params, config, padded, jnp.full((num_experts,), 3, jnp.int32))
    return ByteExperts(
        model=model, prefixes=prefixes, prompt_logits=logits, trie=TokenTrie.build(BYTE_VOCAB),
        allowed=jnp.ones((len(BYTE_VOCAB),), bool), eos_ids=(len(BYTE_VOCAB) - 1,),
        beam=BeamConfig(width=2, threshold=0.05), max_tokens=8, num_contexts=12, num_entries=40,
    )


def check_rows(rows, model_name, num_rows, variants):
    parts = [r["key"] for r in rows]
    want = ["call", "forward", "layers", "lm_head", "log_softmax", "summarize", "tree", "sort", "sum_tree",
            "root_children", "other", "residual", "pool_write", "summary_write"] + [f"forward_{v}" for v in variants]
    assert parts == want
    for r in rows:
        assert r["model"] == model_name and r["rows"] == num_rows
        assert set(bcp.COLUMNS) - {"max_abs_dlogp", "max_abs_dlogp_top", "min_ms", "max_ms", "compile_s"} <= set(r)
        assert np.isfinite(r["median_ms"]) and np.isfinite(r["pct_of_call"])
        if r["kind"] == "measured":
            assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["compile_s"] > 0
    by_key = {r["key"]: r for r in rows}
    assert by_key["call"]["pct_of_call"] == pytest.approx(100.0)
    med = {k: r["median_ms"] for k, r in by_key.items()}
    assert med["residual"] == pytest.approx(med["call"] - med["forward"] - med["summarize"] - med["other"])
    assert med["layers"] == pytest.approx(med["forward"] - med["lm_head"])
    for v in variants:
        d = by_key[f"forward_{v}"]
        assert 0 <= d["max_abs_dlogp_top"] <= d["max_abs_dlogp"] < 1.0
    if "layout" in variants:  # the same arithmetic, the weights in other buffers
        assert by_key["forward_layout"]["max_abs_dlogp"] < 1e-4


def test_profile_on_a_tiny_model():
    variants = ("int8_upcast", "bf16_matmul", "layout")  # bf16_upcast and bf16 left out: compile time
    rows = bcp.profile(tiny_experts(2), "tiny", rows=3, repeats=2, num_particles=4, variants=variants,
                       log=lambda _: None)
    check_rows(rows, "tiny", 3, variants)
    assert markdown_table(rows, bcp.COLUMNS).count("\n") == len(rows) + 1


def test_call_inputs_have_rows_unique_valid_requests():
    experts = tiny_experts(2)
    inputs = bcp.call_inputs(experts, num_particles=4, rows=3)
    c, d = experts.num_slots, experts.trie.max_duplicates
    assert inputs["parent"].shape == (2, 4 * (c * d + (c + c * d) * d))
    assert np.asarray(inputs["valid"]).sum(axis=1).tolist() == [3, 3]
    for k in range(2):
        assert len(set(np.asarray(inputs["token"][k, :3]).tolist())) == 3


def test_int8_round_trip_is_close():
    experts = tiny_experts()
    for params in (experts.model.params, unstack_layers(experts.model.params)):
        stored = bcp.quantize_int8(params)
        assert sum(isinstance(w, bcp.Int8) for w in jax.tree.leaves(stored, is_leaf=lambda w: isinstance(w, bcp.Int8))) > 2
        back = bcp.dequantize_int8(stored)
        assert jax.tree.structure(back) == jax.tree.structure(params)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
            assert a.shape == b.shape
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=float(jnp.max(jnp.abs(a))) / 127)


def test_cli_defaults_and_options():
    args = bcp.parse_args([])
    assert args.models == list(bcp.MODELS) and args.rows == [5, 10] and args.experts == 1
    assert args.variants == list(bcp.VARIANTS) and args.name == "bench_call_profile"
    args = bcp.parse_args(["--models", "gemma3-270m", "--rows", "20", "--repeats", "3", "--variants", "--name", "x"])
    assert args.models == ["gemma3-270m"] and args.rows == [20] and args.repeats == 3 and args.variants == []
    with pytest.raises(SystemExit):
        bcp.parse_args(["--repeats", "0"])



def test_op_kinds_name_the_scans_weight_slices_and_matmuls():
    """Part f's classification on the tiny model's compiled forward (no trace needed): the
    `lax.scan` over stacked layers slices each weight out, and the einsums are named."""
    experts = tiny_experts()
    inputs = bcp.call_inputs(experts, 4, 3)
    paths, depth = jax.jit(jax.vmap(bcp.context_tokens_path))(inputs["stores"], inputs["parent"][:, :3])
    args = (experts.model, experts.prefixes, inputs["stores"].pool, paths, depth, inputs["token"][:, :3])
    ops = bcp.hlo_ops(jax.jit(bcp.forward).lower(*args).compile().as_text())
    kinds = {bcp.op_kind(op) for op in ops.values() if op["opcode"] not in bcp._CONTAINERS}
    assert "per-layer slices of stacked arrays (lax.scan)" in kinds
    assert "weight matmuls (named einsums, LM head)" in kinds


def test_ops_profile_in_a_process_with_traceme(tmp_path):
    """`--ops` end to end on the tiny model: the flag must be set before JAX starts, hence a
    subprocess; every kind's milliseconds are positive and the forward's wall time is recorded."""
    code = (
        "import json, os\n"
        f"os.environ['XLA_FLAGS'] = {bcp.TRACEME_FLAG!r}\n"
        "from tests.test_bench_call_profile import tiny_experts\n"
        "from benchmarks import bench_call_profile as bcp\n"
        "print(json.dumps(bcp.op_rows(tiny_experts(), 'tiny', rows=3, repeats=2, num_particles=4)))\n"
    )
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rows[0]["op_kind"] == "forward (wall, median)" and rows[0]["ms_per_call"] > 0
    kinds = {r["op_kind"]: r for r in rows[1:]}
    assert "per-layer slices of stacked arrays (lax.scan)" in kinds and "weight matmuls (named einsums, LM head)" in kinds
    assert all(r["ms_per_call"] > 0 and r["ops"] >= 1 for r in rows[1:])
