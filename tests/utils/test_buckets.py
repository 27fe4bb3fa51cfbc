"""`smc_jax.utils.buckets`: sizes rounded up to few buckets."""

from smc_jax.utils.buckets import geometric_bucket, multiple_bucket


def test_buckets_are_the_least_that_hold_the_size():
    assert [multiple_bucket(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 16, 16, 32, 32, 48]
    assert [geometric_bucket(n, 128, 4) for n in (1, 128, 129, 512, 513)] == [128, 128, 512, 512, 2048]
