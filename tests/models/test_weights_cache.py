"""How the weights cache reads a saved tokenizer back (the real models: real_model_checks)."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from smc_jax.models import weights_cache


def test_a_saved_pipeline_is_read_by_the_generic_class_and_anything_else_by_auto_tokenizer(tmp_path, monkeypatch):
    vocab = {"<unk>": 0, "<eos>": 1, "hello": 2, "world": 3}
    pipeline = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    pipeline.pre_tokenizer = pre_tokenizers.Whitespace()
    saved = PreTrainedTokenizerFast(tokenizer_object=pipeline, unk_token="<unk>", eos_token="<eos>")
    saved.save_pretrained(tmp_path / "fast")
    read = weights_cache._tokenizer(tmp_path / "fast")
    assert isinstance(read, PreTrainedTokenizerFast) and read.eos_token_id == 1
    assert read.encode("hello world there") == saved.encode("hello world there") == [2, 3, 0]

    import transformers

    (tmp_path / "slow").mkdir()
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda directory: ("auto", directory))
    assert weights_cache._tokenizer(tmp_path / "slow") == ("auto", tmp_path / "slow")
