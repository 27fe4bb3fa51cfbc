"""The evaluated methods (paper Table 5 rows) and how each becomes an `EnsembleSampler`.

Within-model methods use the main model under the task's two prompts; cross-model methods use
two models under one prompt. Base prompts alone are K = 1 token-level SMC with M particles: with
one expert the proposal is the model itself, so every weight stays 1 (uniform) and the expected
accuracy is the fraction of the M samples that are correct -- except that with
at_max_length="eos" a string cut at the limit is weighted by its EOS probability.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from smc_jax.sampler import EnsembleSampler, Expert, Prompt
from smc_jax.settings import DEFAULT_BEAM_WIDTH, DEFAULT_PRUNE_THRESHOLD
from smc_jax.models.lm import LanguageModel
from evaluation.tasks.base import Chat

Experts = Literal["prompt1", "prompt2", "both", "cross", "cross_a", "cross_b"]


@dataclasses.dataclass(frozen=True)
class Method:
    """One row family of Table 5: which experts, at which level, with which sampler.

    Attributes
    ----------
    name, label : str
        The method's name (`--methods`) and its row label.
    level : {"token", "byte", "local"}
        The sampler's level.
    experts : {"prompt1", "prompt2", "both", "cross", "cross_a", "cross_b"}
        Which experts: one prompt, both prompts, the two models, or one of them.
    uses_f : bool
        Whether f matters (False for one expert).
    importance_sampling : bool
        Never resample (ess_threshold = 0).
    resample_finished : bool
        False: resample only the active particles.
    constrained : bool
        Put the instance's constraint (`instance_constraint`) on the outputs as a factor.
    """

    name: str
    label: str
    level: Literal["token", "byte", "local"]
    experts: Experts
    uses_f: bool
    importance_sampling: bool = False  # ess_threshold = 0: never resample
    resample_finished: bool = True  # the paper's Alg. 1; False: resample only active particles
    constrained: bool = False  # the instance's constraint (`instance_constraint`) as a factor

    @property
    def cross_model(self) -> bool:
        return self.experts.startswith("cross")


STUDY_METHODS: dict[str, Method] = {m.name: m for m in (
    Method("prompt1", "Prompt 1", "token", "prompt1", uses_f=False),
    Method("prompt2", "Prompt 2", "token", "prompt2", uses_f=False),
    Method("local", "Token Local", "local", "both", uses_f=True),
    Method("token", "Token SMC", "token", "both", uses_f=True),
    Method("token_is", "Token IS", "token", "both", uses_f=True, importance_sampling=True),
    Method("token_active", "Token SMC (active resampling)", "token", "both", uses_f=True, resample_finished=False),
    Method("byte", "Byte SMC", "byte", "both", uses_f=True),
    Method("cross_byte", "Cross-Model Byte SMC", "byte", "cross", uses_f=True),
    Method("cross_byte_is", "Cross-Model Byte IS", "byte", "cross", uses_f=True, importance_sampling=True),
    Method("cross_byte_active", "Cross-Model Byte SMC (active resampling)", "byte", "cross", uses_f=True,
           resample_finished=False),
    Method("token_constrained", "Token SMC + constraint", "token", "both", uses_f=True, constrained=True),
    Method("token_constrained_is", "Token IS + constraint", "token", "both", uses_f=True, importance_sampling=True,
           constrained=True),
    Method("token_constrained_active", "Token SMC + constraint (active resampling)", "token", "both", uses_f=True,
           resample_finished=False, constrained=True),
    Method("local_constrained", "Token Local + constraint", "local", "both", uses_f=True, constrained=True),
    # K = 1 (prompt 1) times the constraint: the LM restricted to the language, p(x) C(x)
    Method("prompt1_constrained", "Prompt 1 SMC + constraint", "token", "prompt1", uses_f=False, constrained=True),
    Method("prompt1_constrained_is", "Prompt 1 IS + constraint", "token", "prompt1", uses_f=False,
           importance_sampling=True, constrained=True),
    Method("prompt1_constrained_active", "Prompt 1 SMC + constraint (active resampling)", "token", "prompt1",
           uses_f=False, resample_finished=False, constrained=True),
    Method("prompt1_local_constrained", "Prompt 1 Local + constraint", "local", "prompt1", uses_f=False,
           constrained=True),
    Method("cross_byte_constrained", "Cross-Model Byte SMC + constraint", "byte", "cross", uses_f=True,
           constrained=True),
    Method("cross_a", "Cross prompt, model A", "token", "cross_a", uses_f=False),
    Method("cross_b", "Cross prompt, model B", "token", "cross_b", uses_f=False),
)}


@dataclasses.dataclass(frozen=True)
class StudyLevel:
    """The methods a particle study compares at one level: SMC (the paper's Alg. 1), SMC that
    resamples only active particles, importance sampling (the same sampler without resampling)
    and the two experts alone (sanity check (a)).

    Attributes
    ----------
    smc, smc_active, importance : str
        The method names of SMC (Alg. 1), SMC resampling only active particles, and importance
        sampling.
    experts : tuple of str
        The two one-expert methods (sanity check (a)).
    """

    smc: str
    smc_active: str
    importance: str
    experts: tuple[str, str]


STUDY_LEVELS: dict[str, StudyLevel] = {
    "token": StudyLevel("token", "token_active", "token_is", ("prompt1", "prompt2")),  # one model, two prompts
    # one model, two prompts, times the instance's constraint (SMC vs IS with the constraint)
    "token_constrained": StudyLevel("token_constrained", "token_constrained_active", "token_constrained_is",
                                    ("prompt1", "prompt2")),
    "prompt1_constrained": StudyLevel("prompt1_constrained", "prompt1_constrained_active", "prompt1_constrained_is",
                                      ("prompt1", "prompt2")),
    "cross_byte": StudyLevel("cross_byte", "cross_byte_active", "cross_byte_is", ("cross_a", "cross_b")),  # two models
}


def get_method(name: str) -> Method:
    """The method called `name` (one of `STUDY_METHODS`); a ValueError listing them otherwise.

    Parameters
    ----------
    name : str
        The method's name.
    """
    if name not in STUDY_METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(STUDY_METHODS)}")
    return STUDY_METHODS[name]


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """Run-level settings, stored with every record (records under other settings never mix).

    max_length is in tokens (token and local levels), max_bytes in bytes (byte level);
    cross_prompt (1 or 2) is the prompt both models read in cross-model methods.

    Attributes
    ----------
    model, cross_model : str
        The models' names or paths.
    max_length, max_bytes : int
        Length limits in tokens and in bytes.
    at_max_length : {"truncate", "eos"}
        What happens at the limit.
    temperature, ess_threshold, prune_threshold : float
        Sampler settings.
    resampler : str
        The resampler.
    beam_width : int
        The byte beam's width.
    cross_prompt : int
        1 or 2.
    dtype : str
        "float32" or "bfloat16".
    """

    model: str
    cross_model: str | None = None
    max_length: int = 32
    max_bytes: int = 128
    at_max_length: str = "truncate"
    temperature: float = 1.0
    ess_threshold: float = 0.9
    resampler: str = "multinomial"
    beam_width: int = DEFAULT_BEAM_WIDTH
    prune_threshold: float = DEFAULT_PRUNE_THRESHOLD
    cross_prompt: int = 1
    dtype: str = "float32"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def chat_as_text(chat: Chat) -> str:
    """A chat prompt as plain text, messages separated by blank lines (for base models).

    Parameters
    ----------
    chat : list of dict
        Chat messages.
    """
    return "\n\n".join(message["content"] for message in chat)


def has_chat_template(model: LanguageModel) -> bool:
    return model.tokenizer is not None and model.tokenizer.has_chat_template


def cross_prompts(model_a: LanguageModel, model_b: LanguageModel, chat: Chat) -> tuple[Prompt, Prompt]:
    """The one prompt both models read: the chat messages (each model's own template) when both
    have a chat template, else the same plain text for both."""
    if has_chat_template(model_a) and has_chat_template(model_b):
        return chat, chat
    text = chat_as_text(chat)
    return text, text


def experts_for(method: Method, prompts: tuple[Chat, Chat], model: LanguageModel,
                cross_model: LanguageModel | None, cross_prompt: int) -> tuple[Expert, ...]:
    """The experts of `method` for one instance's two prompts.

    Parameters
    ----------
    method : Method
        The method.
    prompts : tuple of two chats
        The instance's prompts 1 and 2.
    model : LanguageModel
        The model.
    cross_model : LanguageModel or None
        The second model of cross-model methods.
    cross_prompt : int
        The prompt (1 or 2) both models read in cross-model methods.
    """
    chat_1, chat_2 = prompts
    if method.experts == "prompt1":
        return (Expert(model, chat_1),)
    if method.experts == "prompt2":
        return (Expert(model, chat_2),)
    if method.experts == "both":
        return Expert(model, chat_1), Expert(model, chat_2)
    if cross_model is None:
        raise ValueError(f"method {method.name!r} needs a second model: pass --cross-model")
    if cross_prompt not in (1, 2):
        raise ValueError(f"cross_prompt must be 1 or 2, got {cross_prompt}")
    prompt_a, prompt_b = cross_prompts(model, cross_model, prompts[cross_prompt - 1])
    pair = (Expert(model, prompt_a), Expert(cross_model, prompt_b))
    return {"cross": pair, "cross_a": pair[:1], "cross_b": pair[1:]}[method.experts]


def instance_constraint(task: str, instance: Any):
    """The constraint a constrained method puts on an instance's outputs:
    json (or json_schema): the instance's schema (compact whitespace); word_sorting: a comma-separated list
    of exactly as many items as the input has words, each one of the input's words (an optional
    leading space); sql: `sql_constraint` of the instance's database. Raises ValueError (naming the keyword) for a schema the compiler refuses."""
    import re

    from smc_jax import constraints

    if task in ("json", "json_schema"):  # "json" is the task's registry name
        return constraints.json_schema(instance.schema, whitespace="")
    if task == "word_sorting":
        words = instance.input.split()
        word = "(?:" + "|".join(re.escape(w) for w in sorted(set(words))) + ")"
        return constraints.regex(f" ?{word}(?:, ?{word}){{{len(words) - 1}}}")
    if task == "sql":
        return sql_constraint(instance.database)
    raise ValueError(f"no constraint is defined for task {task!r} (json, word_sorting and sql have one)")


@functools.lru_cache(maxsize=8)
def sql_constraint(database: Path):
    """The text-to-SQL constraint of a database: `tasks.sql_grammar.select_regex` over its
    tables and columns (compiled once per database; all its questions share it)."""
    from smc_jax import constraints
    from evaluation.tasks.sql_grammar import select_regex
    from evaluation.tasks.sql_schema import read_tables

    tables = read_tables(database)
    return constraints.regex(select_regex([t.name for t in tables], [c for t in tables for c in t.columns]))


def build_sampler(method: Method, f: str, num_particles: int, experts: Sequence[Expert],
                  settings: StudySettings, constraint: Any = None) -> EnsembleSampler:
    """The sampler of one (instance, method, f, M): compiled on its first call, reused per seed.

    Parameters
    ----------
    method : Method
        The method.
    f : str
        The ensemble function.
    num_particles : int
        M.
    experts : sequence of Expert
        From `experts_for`.
    settings : StudySettings
        The run settings.
    constraint : Automaton, optional
        The instance's constraint (`instance_constraint`), for the constrained methods.
    """
    byte = method.level == "byte"
    return EnsembleSampler(
        experts=tuple(experts),
        f=f if method.uses_f else "product",  # K = 1: every f gives the expert itself
        level=method.level,
        num_particles=num_particles,
        ess_threshold=0.0 if method.importance_sampling else settings.ess_threshold,
        resample_finished=method.resample_finished,
        resampler=settings.resampler,
        max_length=settings.max_bytes if byte else settings.max_length,
        temperature=settings.temperature,
        beam_width=settings.beam_width,
        prune_threshold=settings.prune_threshold,
        at_max_length=settings.at_max_length,
        constraint=constraint,
    )


def method_label(method: Method, f: str, fs: Mapping[str, str] | None = None) -> str:
    """The Table 5 row label: "Prompt 1", or "<f>, Token SMC"."""
    if not method.uses_f:
        return method.label
    name = (fs or {}).get(f, f)
    return f"{name}, {method.label}"
