"""benchmarks.bench_matmul_forms: the perf report's grouping and the argument checks (no timing)."""

import pytest

from benchmarks.bench_matmul_forms import parse_args, sample_shares

REPORT = """\
# Samples: 16K of event 'cpu-clock'
#
    37.28%  [.] ynn::transpose_x32_avx512
     5.00%  [.] ynn::dot_bf16_bf16_fp32_32x32x32_16x16x2_amxbf16
     3.59%  [.] __memmove_avx512_unaligned_erms
     3.31%  [k] exc_page_fault
     2.00%  [.] ynn::interleave2_x16_avx512
     1.90%  [.] ynn::dot_fp32_8x4x4_1x4x4_avx512
     0.78%  [.] __sincosf_fma
"""


def test_sample_shares_group_packing_kernels_copies_and_the_rest():
    shares = sample_shares(REPORT)
    assert shares == {"ynn packing": 39.3, "ynn dot kernels": 6.9, "copies": 3.6, "kernel": 3.3, "other": 0.8}


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--repeats", "0"], ["--perf-rows", "0"]])
def test_bad_arguments_stop_before_any_work(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_every_form_computes_the_same_layers(precision):
    """The table compares one function in four forms: same weights (transposed for in_out), same
    result up to the products' rounding; the library's float32 form is the plain product, bit for bit."""
    import jax
    import numpy as np

    from benchmarks.bench_matmul_forms import D, FORMS, layer_matmuls, weights

    x = jax.random.normal(jax.random.PRNGKey(1), (10, D))
    out = {form: np.asarray(layer_matmuls(form)(x, weights(precision, form, jax.random.PRNGKey(0), num_layers=2)))
           for form in FORMS}
    for form in FORMS:
        np.testing.assert_allclose(out[form], out["x_wT"], rtol=0, atol=1e-5 if precision == "f32" else 2e-2)
    if precision == "f32":
        np.testing.assert_array_equal(out["out_in"], out["x_wT"])
    assert not np.array_equal(out["x_wT"], x)  # the layers did something
