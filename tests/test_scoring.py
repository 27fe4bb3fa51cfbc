"""`smc_jax.scoring`'s bucketing, without a model."""

from smc_jax.models.lm import PREFILL_STEP
from smc_jax.scoring import PROMPT_BUCKET, prompt_columns, prompt_size


def test_the_prefill_reads_one_program_up_to_the_first_bucket_then_multiples_of_the_step():
    sizes = range(1, 4 * PROMPT_BUCKET + 1)
    columns = [prompt_columns(n) for n in sizes]
    assert all(n <= c <= prompt_size(n) for n, c in zip(sizes, columns))
    assert set(columns[:PROMPT_BUCKET]) == {PROMPT_BUCKET}  # short prompts share one program
    assert all(c - n < PREFILL_STEP for n, c in zip(sizes, columns) if n > PROMPT_BUCKET)  # little padding read
    assert len(set(columns)) == 1 + 3 * PROMPT_BUCKET // PREFILL_STEP
