"""benchmarks.compare_genlm's statistics, command line and fixed-length target (no GenLM, no real model)."""

import math

import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchmarks.compare_genlm import (
    DEFAULT_RUNS,
    PREFIX_PRODUCT,
    WORKLOADS,
    mean_interval,
    parse_args,
    ratio_interval,
)
from smc_jax.smc import SMC


def test_mean_interval_is_the_t_interval():
    values = [2.0, 2.5, 3.0, 3.5]
    iv = mean_interval(values)
    half = scipy_stats.t.ppf(0.975, 3) * np.std(values, ddof=1) / 2
    assert iv.mean == pytest.approx(2.75) and iv.half_width == pytest.approx(half) and iv.n == 4
    assert math.isnan(mean_interval([1.0]).half_width)


def test_ratio_interval_brackets_the_ratio_of_means():
    rng = np.random.default_rng(1)
    genlm, ours = 7.0 + rng.normal(0, 0.5, 12), 3.0 + rng.normal(0, 0.2, 12)
    r = ratio_interval(genlm, ours)
    assert r.value == pytest.approx(genlm.mean() / ours.mean())
    assert r.low < r.value < r.high and 1.8 < r.low and r.high < 2.9
    assert ratio_interval(genlm, ours) == r  # fixed resampling seed: reproducible
    # constant runs: the interval collapses onto the ratio
    flat = ratio_interval([6.0] * 5, [3.0] * 4)
    assert flat.low == pytest.approx(2.0) and flat.high == pytest.approx(2.0)
    # a wider spread gives a wider interval
    wide = ratio_interval(7.0 + rng.normal(0, 2.0, 12), ours)
    assert wide.high - wide.low > r.high - r.low


def test_ratio_interval_without_enough_runs():
    one = ratio_interval([4.0], [2.0, 2.2])
    assert one.value == pytest.approx(4.0 / 2.1) and math.isnan(one.low) and math.isnan(one.high)
    assert one.format() == f"{4.0 / 2.1:.2f}"
    assert math.isnan(ratio_interval([], [1.0]).value) and ratio_interval([], [1.0]).format() == "n/a"
    assert ratio_interval([6.0, 6.0], [3.0, 3.0]).format() == "2.00 [2.00, 2.00]"


def test_cli_defaults_and_options():
    args = parse_args([])
    assert args.runs == DEFAULT_RUNS == 12 and args.workloads == list(WORKLOADS)
    assert args.torch_threads is None  # GenLM's torch keeps its default thread count
    assert not args.skip_genlm and args.max_tokens == 40 and args.particles == 10 and args.layers is None
    assert args.precision == "f32"  # the headline: float32 on both sides
    args = parse_args(["--workloads", "token-prompts", "smc-models", "--runs", "2", "--skip-genlm",
                       "--torch-threads", "1", "--layers", "stacked"])
    assert args.workloads == ["token-prompts", "smc-models"] and args.runs == 2 and args.skip_genlm
    assert args.layers == "stacked"
    assert args.torch_threads == 1
    assert args.prefetch == args.prefetch_rows == 0 and not args.no_call_costs
    args = parse_args(["--prefetch", "16", "--prefetch-rows", "64", "--no-call-costs", "--precision", "bf16-matmuls"])
    assert args.prefetch == 16 and args.prefetch_rows == 64 and args.no_call_costs and args.precision == "bf16-matmuls"
    assert (args.prefetch_slots, args.prefetch_children) == (4, 1)  # the sampler's defaults
    args = parse_args(["--prefetch", "8", "--prefetch-slots", "16", "--prefetch-children", "0"])
    assert (args.prefetch_slots, args.prefetch_children) == (16, 0)


@pytest.mark.parametrize("argv", [["--workloads", "nope"], ["--runs", "0"], ["--torch-threads", "0"],
                                  ["--max-tokens", "0"], ["--runs", "x"], ["--prefetch", "-1"],
                                  ["--prefetch-rows", "-2"], ["--precision", "fp16"], ["--prefetch-children", "-1"],
                                  ["--prefetch", "8", "--prefetch-slots", "0"], ["--name", "x"], ["--out", "/tmp"]])
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_plain_baseline_is_one_particle_of_one_prompt(monkeypatch):
    """The token workload's baseline samples one sequence of exactly max_tokens tokens from the
    first prompt alone (no ensemble): one expert, one particle, truncated at the length."""
    import benchmarks.compare_genlm as cg

    monkeypatch.setattr(cg, "EnsembleSampler", lambda **kwargs: kwargs)
    settings = cg.Settings(runs=1, beam_width=5, prune_threshold=0.05, particles=10, ess_threshold=0.9, max_tokens=7)
    model = object()
    made = cg.plain_sampler(lambda name: model, settings)
    assert [(e.model, e.prompt) for e in made["experts"]] == [(model, cg.PROMPTS[0])]
    assert made["num_particles"] == 1 and made["level"] == "token"
    assert made["max_length"] == 7 and made["at_max_length"] == "truncate"
    assert isinstance(made["f"], cg.PrefixProduct) and made["f"].num_experts == 1


def test_prefix_product_generates_exactly_max_length(ngram_experts):
    """The token workload's target: EOS is never proposed, every particle stops unfinished at L,
    and its weight is P1(x) P2(x) / q(x) (no EOS factor)."""
    smc = SMC(num_particles=16, max_length=6, ess_threshold=0.0, at_max_length="truncate")
    res = smc(jax.random.key(3), list(ngram_experts), PREFIX_PRODUCT)
    assert (np.asarray(res.lengths) == 6).all() and not np.asarray(res.finished).any()
    assert np.isfinite(res.log_weights).all()
    # importance sampling: the weight is psi(x) / q(x) = P1(x) P2(x) / q(x) >= P1(x) P2(x)
    log_p = np.asarray(res.expert_logprobs).sum(axis=1)
    assert (np.asarray(res.log_weights) >= log_p - 1e-4).all()  # q(x) <= 1


def test_genlm_gets_a_plain_byte_level_decoder():
    """GenLM reads a GPT-2 vocabulary only through a plain ByteLevel decoder: a Sequence holding
    one (transformers 5.17's GGUF conversion) is replaced in a copy; other tokenizers pass."""
    from benchmarks.genlm_side import plain_byte_level
    from tests.bytes.test_vocab import sequence_decoder_toy

    tok = sequence_decoder_toy()
    plain = plain_byte_level(tok)
    assert plain is not tok and type(plain.backend_tokenizer.decoder).__name__ == "ByteLevel"
    assert type(tok.backend_tokenizer.decoder).__name__ == "Sequence"  # the original is left as it was
    assert plain.get_vocab() == tok.get_vocab()
    assert plain_byte_level(plain) is plain
    try:  # with the genlm extra: GenLM's own byte vocabulary reads 'Ġ' as b' ' only from the copy
        from genlm.backend.tokenization import decode_vocab
    except ImportError:
        return
    space = tok.convert_tokens_to_ids("\u0120")
    assert decode_vocab(tok)[0][space].byte_string == "\u0120".encode()
    assert decode_vocab(plain)[0][space].byte_string == b" "


def test_genlm_gets_a_piece_for_every_id(monkeypatch):
    """Where a SentencePiece tokenizer answers None for an id, GenLM's copy answers the piece of
    smc_jax's byte string for it (GenLM's reading gives back those bytes), or a marker where
    smc_jax has none; a tokenizer without such ids, or a byte-level one, passes unchanged."""
    import re

    from benchmarks import genlm_side
    from smc_jax.bytes import vocab
    from smc_jax.experts import byte

    class Toy:
        def __init__(self, pieces):
            self.pieces = pieces

        def __len__(self):
            return len(self.pieces)

        def convert_ids_to_tokens(self, i, skip_special_tokens=False):
            return self.pieces[i]

    strings = [b"a", b" b", b"x y", b"\xc3", None, b"c"]
    monkeypatch.setattr(byte, "token_bytes", lambda model: strings)
    monkeypatch.setattr(vocab, "detect_scheme", lambda tok: vocab.TokenizerScheme.SENTENCEPIECE)
    whole = Toy(["a", "\u2581b", "x\u2581y", "<0xC3>", "<pad>", "c"])
    assert genlm_side.filled_pieces(whole, None) is whole
    holes = Toy(["a", "\u2581b", None, None, None, "c"])
    filled = genlm_side.filled_pieces(holes, None)
    # GenLM's SentencePiece reading: <0xNN> escapes to their byte, then U+2581 to a space
    read = lambda piece: re.sub(rb"<0x(..)>", lambda m: bytes.fromhex(m[1].decode()), piece.encode()).replace(
        "\u2581".encode(), b" ")
    assert [read(filled.convert_ids_to_tokens(i)) for i in range(4)] == strings[:4]
    assert filled.convert_ids_to_tokens(4) == "<no piece 4>" and filled.convert_ids_to_tokens([5, 0]) == ["c", "a"]
    assert holes.convert_ids_to_tokens(2) is None  # the original is left as it was
    monkeypatch.setattr(vocab, "detect_scheme", lambda tok: vocab.TokenizerScheme.BYTE_LEVEL)
    assert genlm_side.filled_pieces(holes, None) is holes
