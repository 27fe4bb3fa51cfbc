"""The GenLM side of `benchmarks.compare_genlm`: GenLM's models (genlm-backend's AsyncTransformer
over transformers' float32 load of the same GGUF file), their forward-pass logs, and GenLM's
byte-level reading and SMC runs, timed the way the smc_jax side is.

Everything GenLM is imported inside the functions, so the smc_jax side runs (and this module
imports) without the `genlm` extra; `settings` is `compare_genlm.Settings` (beam_width,
prune_threshold, runs, particles, ess_threshold, max_tokens). Torch's thread count is left at
torch's default unless `GenLM(torch_threads=N)` asks for N.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from smc_jax.sampler import Expert
from smc_jax.models.lm import LanguageModel
from smc_jax.models.registry import resolve

GENLM_MISSING = (
    "GenLM is not installed: pip install -e '.[genlm]' (genlm-control, genlm-bytes, genlm-backend), "
    "or pass --skip-genlm to run only the smc_jax side"
)


class ForwardLog:
    """The batched forward passes of one AsyncTransformer's torch model: rows, tokens, seconds."""

    def __init__(self, llm: Any) -> None:
        self.calls: list[tuple[int, int, float]] = []
        forward = llm.model.forward

        def logged(input_ids, *args, **kwargs):
            start = time.perf_counter()
            out = forward(input_ids, *args, **kwargs)
            self.calls.append((int(input_ids.shape[0]), int(input_ids.shape[1]), time.perf_counter() - start))
            return out

        llm.model.forward = logged


def plain_byte_level(tokenizer: Any) -> Any:
    """The tokenizer for GenLM: a GPT-2 byte-level tokenizer whose decoder is a Sequence holding
    a ByteLevel step (how transformers 5.17 converted SmolLM2's GGUF on the GPU machine) is copied
    with a plain ByteLevel decoder, the one GenLM's byte-vocabulary reader recognizes (with the
    Sequence it read the pieces as SentencePiece and its beam could not read the prompt). Same
    vocabulary and ids; any other tokenizer is returned as it is."""
    import copy

    from tokenizers import decoders

    from smc_jax.bytes.vocab import TokenizerScheme, detect_scheme

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or detect_scheme(tokenizer) is not TokenizerScheme.BYTE_LEVEL:
        return tokenizer
    if type(backend.decoder).__name__ == "ByteLevel":
        return tokenizer
    plain = copy.deepcopy(tokenizer)
    plain.backend_tokenizer.decoder = decoders.ByteLevel()
    return plain


def filled_pieces(tokenizer: Any, model: LanguageModel) -> Any:
    """The tokenizer for GenLM's SentencePiece reader, which asks `convert_ids_to_tokens` for
    every id: where that returns None (an id the tokenizer's vocabulary lacks; seen with Gemma 3's
    GGUF tokenizer under transformers 5.17 on the GPU machine, where genlm-backend failed on it),
    a shallow copy answers with the piece of smc_jax's byte string for the id (spaces as "▁",
    bytes that are not UTF-8 as "<0xXX>"), or, for an id without one (smc_jax never samples it),
    a marker "<no piece N>", as GenLM reads special tokens by their names. Any other tokenizer is
    returned as it is."""
    import copy

    from smc_jax.bytes.vocab import TokenizerScheme, detect_scheme
    from smc_jax.experts.byte import token_bytes

    if detect_scheme(tokenizer) is TokenizerScheme.BYTE_LEVEL:
        return tokenizer
    holes = [i for i in range(len(tokenizer)) if tokenizer.convert_ids_to_tokens(i) is None]
    if not holes:
        return tokenizer
    strings = token_bytes(model)

    def piece(data: bytes) -> str:
        try:
            return data.decode("utf-8").replace(" ", "\u2581")
        except UnicodeDecodeError:
            return "".join(f"<0x{byte:02X}>" for byte in data)

    fill = {i: f"<no piece {i}>" if strings[i] is None else piece(strings[i]) for i in holes}
    original = tokenizer.convert_ids_to_tokens

    def convert(ids: Any, skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return fill[ids] if ids in fill else original(ids, skip_special_tokens=skip_special_tokens)
        return [convert(i, skip_special_tokens) for i in ids]

    filled = copy.copy(tokenizer)
    filled.convert_ids_to_tokens = convert
    return filled


class GenLM:
    """GenLM's models (AsyncTransformer over transformers' float32 load of the same GGUF file,
    cast to bfloat16 with `bf16`, with smc_jax's tokenizer of that file), loaded on first use, and
    their forward logs."""

    def __init__(self, torch_threads: int | None, bf16: bool = False) -> None:
        import torch

        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.torch = torch
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        # GenLM's own loader (load_model_by_name) places the model with device_map="auto": the GPU when there is one.
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.llms: dict[str, Any] = {}
        self.logs: dict[str, ForwardLog] = {}

    def threads(self) -> dict[str, int]:
        """The torch thread counts in use (intra-op and inter-op)."""
        return {"torch_threads": self.torch.get_num_threads(), "torch_interop_threads": self.torch.get_num_interop_threads()}

    def llm(self, model: LanguageModel) -> Any:
        if model.name not in self.llms:
            from genlm.backend.llm import AsyncTransformer
            from transformers import AutoModelForCausalLM

            path = resolve(model.name)[1]
            hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=self.torch.float32)
            hf = hf.to(self.device, self.dtype).eval()
            self.llms[model.name] = AsyncTransformer(hf, filled_pieces(plain_byte_level(model.tokenizer.hf), model))
            self.logs[model.name] = ForwardLog(self.llms[model.name])
        return self.llms[model.name]

    def eos_byte_strings(self, model: LanguageModel) -> list[bytes]:
        """The byte strings of smc_jax's EOS ids in GenLM's byte vocabulary (both sides end at the same tokens)."""
        vocab = self.llm(model).byte_vocab
        return [vocab[i].byte_string for i in model.tokenizer.eos_token_ids]

    def beam_params(self, model: LanguageModel, settings: Any) -> Any:
        from genlm.bytes import BeamParams

        return BeamParams(K=settings.beam_width, prune_threshold=settings.prune_threshold,
                          eos_byte_strings=self.eos_byte_strings(model))

    def reset(self, seed: int | None = None) -> None:
        """Empty the model-output caches and forward logs; seed GenLM's random draws."""
        for name, llm in self.llms.items():
            llm.clear_cache()
            self.logs[name].calls.clear()
        if seed is not None:
            np.random.seed(seed)
            self.torch.manual_seed(seed)

    def forward_calls(self) -> list[tuple[int, int, float]]:
        return [call for log in self.logs.values() for call in log.calls]


def genlm_text(genlm: GenLM, model: LanguageModel, settings: Any, text: bytes, prompt: str) -> dict[str, Any]:
    """(a) GenLM: next-byte distributions along `text` after `prompt` ([len + 1, 258]: bytes, EOT,
    EOS), times and calls. The beam after the prompt is built once (untimed, as smc_jax's start
    state); each run empties the model-output cache and reads `text` from it."""
    from genlm.bytes import AsyncTokenByteTrie, ByteBeamState, LazyTrieState
    from genlm.bytes.trie import TrieMode

    llm = genlm.llm(model)
    params = genlm.beam_params(model, settings)
    trie = AsyncTokenByteTrie.from_vocab(llm.byte_vocab, eos_byte_strings=params.eos_byte_strings)

    async def read(beam: Any) -> np.ndarray:
        rows = []
        for byte in text:
            rows.append(np.asarray((await beam.logp_next()).ps))
            beam = await (beam.prune() << byte)
        rows.append(np.asarray((await beam.logp_next()).ps))
        return np.stack(rows)

    async def runs() -> dict[str, Any]:
        genlm.reset()
        state = await LazyTrieState.initial(llm, trie, mode=TrieMode.WITH_EOS).materialize()
        start_beam = await ByteBeamState([state], params).prefill(prompt.encode())
        times, calls = [], []
        for run in range(settings.runs + 1):  # the first is the warm-up
            genlm.reset()
            start = time.perf_counter()
            logps = await read(start_beam)
            if run:
                times.append(time.perf_counter() - start)
                calls.append(genlm.forward_calls())
        await trie.cleanup()
        return {"logprobs": logps, **summarize_genlm(times, calls)}

    return asyncio.run(runs())


def generated_length(context: Sequence[Any]) -> int:
    """Symbols a GenLM particle generated (its closing EOS not counted)."""
    from genlm.control.constant import EOS

    return len(context) - (1 if context and context[-1] is EOS else 0)


def genlm_smc(genlm: GenLM, potentials: Callable[[], list[Any]], settings: Any, warmup_seed: int,
              fixed_length: int | None = None) -> dict[str, Any]:
    """(b) GenLM: direct_token_sampler(Product(p1, p2)).smc(...) with seeds 0, 1, ... after a
    warm-up run with `warmup_seed`; the prompts are read once first (timed apart).

    With `fixed_length` = L, every particle generates exactly L symbols: the product gets a
    factor that gives EOS weight 0 (`no_eos`) and `terminate_when` closes a particle at L with no
    EOS factor, so the target is p1(x) p2(x) over the strings of L symbols (prefix probabilities).
    Otherwise the particles end at EOS or at max_tokens (which counts the forced EOS)."""
    from genlm.control import direct_token_sampler
    from genlm.control.potential import Product

    async def runs() -> dict[str, Any]:
        p1, p2 = potentials()
        product = Product(p1, p2)
        max_tokens, terminate_when = settings.max_tokens, None
        if fixed_length is not None:
            product = Product(product, no_eos(product))
            max_tokens = fixed_length + 1  # never reached: terminate_when closes the particle at L
            terminate_when = lambda context: len(context) >= fixed_length  # noqa: E731
        sampler = direct_token_sampler(product)

        async def read_prompts() -> None:
            await p1.logw_next([])  # ByteLLM keeps the beam after its prompt; PromptedLLM its logits
            await p2.logw_next([])

        genlm.reset()
        start = time.perf_counter()
        await read_prompts()
        prompt_s, prompt_calls = time.perf_counter() - start, len(genlm.forward_calls())
        times, calls, lengths, zero_weight = [], [], [], 0
        for seed in [warmup_seed, *range(settings.runs)]:
            genlm.reset(seed)
            for p in (p1, p2):
                await p.cleanup()  # ByteLLM: empties its beam cache, keeps the prompt's beam
            await read_prompts()  # the prompts' own outputs back in the emptied cache (untimed)
            for log in genlm.logs.values():
                log.calls.clear()
            start = time.perf_counter()
            sequences = await sampler.smc(n_particles=settings.particles, ess_threshold=settings.ess_threshold,
                                          max_tokens=max_tokens, resampling_method="multinomial",
                                          terminate_when=terminate_when)
            if seed != warmup_seed:
                times.append(time.perf_counter() - start)
                calls.append(genlm.forward_calls())
                lengths.append([generated_length(context) for context in sequences.contexts])
                zero_weight += sequences.log_ml == -math.inf
        for p in (p1, p2):
            await p.cleanup()
        return {"prompt_s": prompt_s, "prompt_calls": prompt_calls, "lengths": lengths,
                "zero_weight_runs": int(zero_weight), **summarize_genlm(times, calls)}

    return asyncio.run(runs())


def no_eos(like: Any) -> Any:
    """A GenLM potential over `like`'s vocabulary that is 1 on every token and 0 on EOS (log: 0 and
    -inf), computed as one array per batch: multiplied into a product it forbids ending."""
    from genlm.control.potential import Potential

    class NoEOS(Potential):
        async def prefix(self, context):
            return 0.0

        async def complete(self, context):
            return -math.inf

        async def logw_next(self, context):
            return self.make_lazy_weights(self._rows(1)[0])

        async def batch_logw_next(self, contexts):
            return self.make_lazy_weights(self._rows(len(contexts)))

        def _rows(self, n: int) -> np.ndarray:
            rows = self.alloc_rows(n, 0.0)
            rows[:, -1] = -math.inf
            return rows

    return NoEOS(like.vocab, tables=like.tables)


def summarize_genlm(times: list[float], calls: list[list[tuple[int, int, float]]]) -> dict[str, Any]:
    """Per run: wall time, forward calls and forward seconds; means per call over all runs."""
    flat = [c for run in calls for c in run]
    return {
        "times": times,
        "calls_per_run": [len(run) for run in calls],
        "forward_s_per_run": [sum(c[2] for c in run) for run in calls],
        "rows_per_call": float(np.mean([c[0] for c in flat])) if flat else 0.0,
        "tokens_per_row": float(np.mean([c[1] for c in flat])) if flat else 0.0,
        "seconds_per_call": float(np.mean([c[2] for c in flat])) if flat else 0.0,
    }


def byte_potentials(genlm: GenLM, experts: Sequence[Expert], settings: Any) -> Callable[[], list[Any]]:
    from genlm.control import ByteLLM

    def make() -> list[Any]:
        out = []
        for e in experts:
            p = ByteLLM(genlm.llm(e.model), genlm.beam_params(e.model, settings))
            p.set_prompt_from_str(e.prompt)
            out.append(p)
        return out

    return make


def token_potentials(genlm: GenLM, experts: Sequence[Expert]) -> Callable[[], list[Any]]:
    from genlm.control import PromptedLLM

    def make() -> list[Any]:
        return [PromptedLLM(genlm.llm(e.model), prompt_ids=e.prompt_ids(), eos_byte_strings=genlm.eos_byte_strings(e.model))
                for e in expert_list]

    expert_list = list(experts)
    return make
