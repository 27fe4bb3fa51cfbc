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
