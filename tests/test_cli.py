"""The command line on the embedded models: a short token-level run, JSON output, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from smc_jax.cli import _short, main


_PROCESS = """
import collections
import jax, jax.numpy as jnp, numpy as np
events = collections.Counter()
jax.monitoring.register_event_listener(lambda event, **_: events.update([event.rsplit("/", 1)[-1]]))
import smc_jax  # the library's default: compiled programs persist
jax.jit(lambda x: jnp.sin(x) * 3 + jnp.cos(x))(np.arange(7, dtype=np.float32)).block_until_ready()
print(events["cache_misses"], events["cache_hits"], jax.config.jax_compilation_cache_dir)
"""


def _process(env: dict[str, str]) -> tuple[int, int, str]:
    """(persistent-cache misses, hits, the cache directory) of a fresh process that compiles one
    function."""
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "SMC_JAX_NO_CACHE")}
    env = {**base, "JAX_PLATFORMS": "cpu", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", **env}
    out = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True, check=True)
    misses, hits, directory = out.stdout.split()
    return int(misses), int(hits), directory


def test_compiled_programs_persist_across_processes(tmp_path):
    env = {"SMC_JAX_CACHE_DIR": str(tmp_path)}
    assert _process(env) == (1, 0, str(tmp_path / "xla"))  # compiled, and written
    assert any((tmp_path / "xla").iterdir())
    assert _process(env) == (0, 1, str(tmp_path / "xla"))  # a new process loads it
    # SMC_JAX_NO_CACHE turns it off; a cache the user chose is left alone
    assert _process({**env, "SMC_JAX_NO_CACHE": "1"}) == (0, 0, "None")
    own = tmp_path / "own"
    assert _process({**env, "JAX_COMPILATION_CACHE_DIR": str(own)}) == (1, 0, str(own)) and any(own.iterdir())


def _threshold(env: dict[str, str]) -> float:
    """The persistent cache's least compile seconds in a fresh process after `import smc_jax`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_PERSISTENT_CACHE", "SMC_JAX_NO_CACHE"))}
    code = "import jax, smc_jax; print(jax.config.jax_persistent_cache_min_compile_time_secs)"
    out = subprocess.run([sys.executable, "-c", code], env={**base, "JAX_PLATFORMS": "cpu", **env}, capture_output=True,
                         text=True, check=True)
    return float(out.stdout)


def test_programs_of_a_fifth_of_a_second_are_kept_unless_the_user_set_the_threshold(tmp_path):
    """JAX keeps only programs that compiled for 1 s; the library keeps those of 0.2 s (the
    prompt prefills), in its own cache directory or one the user chose, but not a threshold the
    user set."""
    from smc_jax.utils.compilation import MIN_CACHED_COMPILE_S

    assert MIN_CACHED_COMPILE_S < 1.0
    assert _threshold({"SMC_JAX_CACHE_DIR": str(tmp_path)}) == MIN_CACHED_COMPILE_S
    assert _threshold({"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "own")}) == MIN_CACHED_COMPILE_S
    assert _threshold({"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"}) == 2.0
    assert _threshold({"SMC_JAX_NO_CACHE": "1"}) == 1.0  # no cache: JAX's settings untouched


_CLI_PROCESS = """
import collections, sys
import jax
events = collections.Counter()
jax.monitoring.register_event_listener(lambda event, **_: events.update([event.rsplit("/", 1)[-1]]))
from smc_jax.cli import main
status = main(sys.argv[1:])
print("persistent cache:", events["cache_misses"], events["cache_hits"], file=sys.stderr)
sys.exit(status)
"""


@pytest.mark.slow
@pytest.mark.real_model
def test_precompile_then_sample_with_its_progress_bar_compiles_nothing(tmp_path):
    """`smc-jax precompile` keeps every program that `smc-jax sample` (same options, progress bar
    on, as a user runs it) needs: the sampling process loads them all from the persistent cache.
    Neither has a host call inside a program (such a program is never cached)."""
    from smc_jax.models.weights_cache import cache_root

    for converted in cache_root().glob("*-*"):  # models converted already need not be again
        (tmp_path / converted.name).symlink_to(converted)
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "SMC_JAX_NO_CACHE")}
    env = {**base, "JAX_PLATFORMS": "cpu", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "SMC_JAX_CACHE_DIR": str(tmp_path)}
    options = ["-e", "smollm2-135m-instruct", "My favorite physicist is",
               "-e", "smollm2-135m-instruct", "My favorite author is", "--level", "token", "-M", "4",
               "--max-length", "3", "--seed", "1"]

    def run(command: str) -> tuple[int, int, str]:
        out = subprocess.run([sys.executable, "-c", _CLI_PROCESS, command, *options], env=env, capture_output=True,
                             text=True, check=True)
        assert "sampling (" in out.stderr  # the progress bar reported steps
        misses, hits = out.stderr.strip().splitlines()[-1].split(":")[1].split()
        return int(misses), int(hits), out.stdout

    misses, _, out = run("precompile")
    assert misses > 0 and f"kept in {tmp_path / 'xla'}" in out
    misses, hits, out = run("sample")
    assert (misses, hits > 0) == (0, True)
    assert "log Z-hat:" in out


def test_models_lists_the_embedded_models(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct" in out and "gemma3-270m" in out


def test_short_text_escapes_control_characters_only():
    assert _short('it\'s "x"\n\né') == 'it\'s "x"\\n\\né'
    assert _short("a" * 100, width=10) == "a" * 9 + "…"


@pytest.mark.slow
@pytest.mark.real_model
def test_token_level_run_prints_weighted_particles(capsys):
    argv = ["sample", "-e", "smollm2-135m-instruct", "My favorite physicist is",
            "-e", "smollm2-135m-instruct", "My favorite author is",
            "--level", "token", "-M", "4", "--max-length", "3", "--json", "--seed", "1"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    weights = [p["weight"] for p in out["particles"]]
    assert len(weights) == 4 and abs(sum(weights) - 1) < 1e-5
    assert out["log_Z"] is not None and out["log_Z"] < 0
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["particles"] == out["particles"]  # same seed, same result
    assert main(argv + ["--resample-active-only"]) == 0
    active = json.loads(capsys.readouterr().out)
    assert len(active["particles"]) == 4 and active["log_Z"] is not None and active["log_Z"] < 0


@pytest.mark.slow
@pytest.mark.real_model
def test_bad_input_gives_a_message_not_a_trace(capsys):
    assert main(["sample", "-e", "no-such-model", "hi", "--level", "token"]) == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert last_line.startswith("smc-jax: error:") and "no-such-model" in last_line
    assert main(["sample", "-e", "smollm2-135m-instruct", "hi", "--weights", "-1", "--level", "token"]) == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.startswith("smc-jax: error:") and "weight" in last_line


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fails the test if the CLI loads any model (validation must come first)."""
    import smc_jax.models

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were validated")

    monkeypatch.setattr(smc_jax.models, "load_model", forbidden)


@pytest.mark.parametrize("extra, message", [
    (["-M", "0"], "num_particles"),
    (["--max-length", "0"], "max_length"),
    (["--ess-threshold", "1.5"], "ess_threshold"),
    (["--temperature", "0"], "temperature"),
    (["--beam-width", "0"], "beam_width"),
    (["--prune-threshold", "1"], "prune_threshold"),
    (["--level", "token", "--no-heal"], "heal"),
    (["--weights", "0.5", "0.2"], "simplex"),
    (["--weights", "1"], "one weight per expert"),
    (["--top", "0"], "--top"),
    (["-e", "gemma3-270m", "\ud800"], "not valid text"),
])
def test_bad_arguments_fail_before_any_model_loads(no_model_loads, capsys, extra, message):
    assert main(["sample", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smc-jax: error:") and message in err, err


def test_cli_defaults_are_the_library_defaults():
    from smc_jax.cli import build_parser, settings_of
    from smc_jax.settings import DEFAULTS

    args = build_parser().parse_args(["sample"])
    assert settings_of(args).replace(progress=False) == DEFAULTS


def test_no_heal_turns_healing_off():
    from smc_jax.cli import build_parser, settings_of

    assert settings_of(build_parser().parse_args(["sample"])).heal
    settings = settings_of(build_parser().parse_args(["sample", "--no-heal"]))
    assert not settings.heal and not settings.beam().heal


def test_precision_flags_reach_the_loader(monkeypatch):
    """--bf16 loads bfloat16 params, --bf16-matmuls bfloat16 matmul weights (float32
    activations), neither float32; the two flags exclude each other."""
    import jax.numpy as jnp

    import smc_jax.models
    from smc_jax.cli import _load_models, build_parser, precision_of

    calls = []
    monkeypatch.setattr(smc_jax.models, "load_model", lambda name, **kw: calls.append((name, kw)) or name)

    class Bar:
        set_description = update = staticmethod(lambda *a: None)

    for flags, expected in [([], {}), (["--bf16"], {"dtype": jnp.bfloat16}),
                            (["--bf16-matmuls"], {"matmul_dtype": jnp.bfloat16})]:
        calls.clear()
        args = build_parser().parse_args(["sample", *flags])
        assert _load_models(["m", "m"], Bar(), **precision_of(args)) == {"m": "m"}
        assert calls == [("m", expected)]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sample", "--bf16", "--bf16-matmuls"])
