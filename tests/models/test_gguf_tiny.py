"""GGUF loading of every architecture: tiny float32 GGUF files written in llama.cpp's layout
(Q/K row permutation for llama, norms + 1 for Gemma, fused QKV / gate-up for Phi-3, transposed
Conv1D weights for GPT-2, rope_freqs for Llama 3 scaling, norms + 1 and soft caps for Gemma 2,
q/k norms for Qwen 3 and OLMo 2, YaRN keys for Qwen 3, Mistral as llama.cpp's llama) give the
original model's logits, and those of its safetensors load."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from tests.helpers import tiny_checkpoints as tc

from smc_jax.models.gguf_loader import load_gguf_checkpoint
from smc_jax.models.lm import forward
from smc_jax.models.params import to_device
from smc_jax.models.safetensors_loader import load_hf_checkpoint

ATOL = 1e-5


@pytest.mark.parametrize("arch", tc.GGUF_ARCHITECTURES)
def test_gguf_matches_the_original_model(arch, tmp_path):
    reference = tc.build(arch, tmp_path / "hf")
    path = tc.write_gguf(arch, reference, tmp_path / f"{arch}.gguf")
    config, flat, _ = load_gguf_checkpoint(path)
    tokens = np.random.default_rng(6).integers(0, tc.VOCAB, size=(2, 12))
    positions = np.broadcast_to(np.arange(12), tokens.shape)
    got = forward(to_device(flat, jnp.float32), config, jnp.asarray(tokens), jnp.asarray(positions),
                  jnp.ones(tokens.shape, bool))
    np.testing.assert_allclose(np.asarray(got), tc.torch_logits(reference, tokens), atol=ATOL, rtol=0)
    # ... and the same model's safetensors load (e.g. Mistral, read by llama.cpp as a llama).
    hf_config, hf_flat = load_hf_checkpoint(tmp_path / "hf")
    from_hf = forward(to_device(hf_flat, jnp.float32), hf_config, jnp.asarray(tokens), jnp.asarray(positions),
                      jnp.ones(tokens.shape, bool))
    np.testing.assert_allclose(np.asarray(got), np.asarray(from_hf), atol=ATOL, rtol=0)


def _tiny_gguf(path) -> tuple[int, int]:
    """A two-tensor GGUF written by the gguf package; returns (file size, end of the first tensor)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((8, 4), np.float32))
    writer.add_tensor("output_norm.weight", np.ones((4,), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(path)
    first = reader.tensors[0]
    return path.stat().st_size, first.data_offset + first.n_bytes


@pytest.mark.parametrize("cut", ["tensor", "header"])
def test_truncated_gguf_names_what_is_missing(tmp_path, cut):
    from smc_jax.models.gguf_loader import CorruptFileError

    path = tmp_path / "tiny.gguf"
    _, first_end = _tiny_gguf(path)
    data = path.read_bytes()
    keep = first_end - 4 if cut == "tensor" else 40
    path.write_bytes(data[:keep])
    with pytest.raises(CorruptFileError, match="file truncated/corrupt: expected") as err:
        load_gguf_checkpoint(path)
    if cut == "tensor":
        assert "expected 128 bytes for tensor token_embd.weight" in str(err.value)
