"""smollm2-135m-instruct (embedded GGUF) against transformers' GGUF loading: see real_model_checks."""

import pytest
from tests.helpers.real_model_checks import *  # noqa: F403  (the shared checks become this module's tests)
from tests.helpers.real_model_checks import MARKS, load_pair

pytestmark = MARKS


@pytest.fixture(scope="module")
def pair():
    return load_pair("smollm2-135m-instruct")
