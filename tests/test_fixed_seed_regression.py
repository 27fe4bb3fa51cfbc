"""Fixed-seed regression: a few runs at each level. Same key, same samples: a refactor that
changes any text, weight or log Z-hat here changed behaviour.

The recorded values are literals below. To re-record after an *intended* behaviour change, run

    PYTHONPATH=$PWD python tests/test_fixed_seed_regression.py

and paste its output over RECORDED (say in the commit why the samples changed).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import smc_jax as sj
from smc_jax.experts import ExpertStack

# Tolerances: float32 arithmetic, same program, same machine class; loose enough for XLA's
# reassociation across versions, tight enough that a different sample or weight update fails.
RTOL = 1e-4
ATOL = 1e-4

SMOL = "smollm2-135m-instruct"


def _summary(result: sj.SMCResult) -> dict:
    return {
        "texts": [t if isinstance(t, str) else [int(c) for c in t] for t in result.texts],
        "log_weights": [float(v) for v in result.log_weights],
        "log_Z": None if result.log_Z is None else float(result.log_Z),
        "resampled": int(np.sum(result.resampled)),
    }


def run_toy(f: str, resample_finished: bool, seed: int) -> dict:
    """Two table experts over 'abc' (tests/conftest.py's overlapping tables) through `sj.SMC`."""
    from tests.conftest import ALPHABET, random_table

    base = random_table(1, size=10)
    t2 = random_table(2, size=10)
    for s in list(base)[:5]:
        t2[s] = t2.get(s, 0.0) + 0.1
    z2 = sum(t2.values())
    t2 = {s: p / z2 for s, p in t2.items()}
    experts = ExpertStack(groups=(sj.TableExpert.from_table(base, alphabet=ALPHABET),
                                  sj.TableExpert.from_table(t2, alphabet=ALPHABET)))
    smc = sj.SMC(num_particles=8, max_length=4, ess_threshold=0.9, resample_finished=resample_finished)
    result = smc(jax.random.key(seed), experts, sj.make_ensemble(f, 2, [0.4, 0.6]),
                 decode=lambda s: "".join(ALPHABET[int(c)] for c in s))
    return _summary(result)


def run_ngram(seed: int) -> dict:
    k1, k2 = jax.random.split(jax.random.key(7))
    experts = ExpertStack(groups=(sj.NGramExpert.random(k1, alphabet_size=2, order=2, eos_logit=0.5),
                                  sj.NGramExpert.random(k2, alphabet_size=2, order=3, eos_logit=0.5)))
    smc = sj.SMC(num_particles=6, max_length=5, ess_threshold=0.9)
    return _summary(smc(jax.random.key(seed), experts, sj.make_ensemble("min", 2), decode=tuple))


def run_model(model, level: str, seed: int, **kwargs) -> dict:
    experts = [(model, "My favorite physicist is"), (model, "My favorite author is")]
    result = sj.sample(experts, "product", level=level, num_particles=3, max_length=6, seed=seed, **kwargs)
    return _summary(result)


TOY_CASES = {
    "toy-product-alg1-0": lambda: run_toy("product", True, 0),
    "toy-min-active-1": lambda: run_toy("min", False, 1),
    "toy-mixture-alg1-2": lambda: run_toy("mixture", True, 2),
    "ngram-min-3": lambda: run_ngram(3),
}
MODEL_CASES = {
    "smol-token-0": lambda m: run_model(m, "token", 0),
    "smol-local-1": lambda m: run_model(m, "local", 1),
    "smol-byte-0": lambda m: run_model(m, "byte", 0),
    "smol-byte-truncate-active-2": lambda m: run_model(m, "byte", 2, at_max_length="truncate",
                                                       resample_finished=False),
}
# Token healing (on by default) changed none of the recorded byte-level runs; with it off they
# must be the same runs too (heal=False is the program without healing).
HEAL_OFF_CASES = {
    "smol-byte-0": lambda m: run_model(m, "byte", 0, heal=False),
}


# Recorded at commit 01727a1 (before the refactor) on CPU; the two token-level runs (smol-token-0,
# smol-local-1) re-recorded when token draws over large vocabularies took two exact stages
# (`smc.draw`): same distribution, other samples per key. Every other run is unchanged.
RECORDED: dict[str, dict] = {'toy-product-alg1-0': {'texts': ['bcb', 'cca', 'cca', 'ccaa', 'bcb', 'cca', 'ccaa', 'caba'],
                        'log_weights': [-0.9963891506195068,
                                        -1.1164650917053223,
                                        -1.1164650917053223,
                                        -1.1164650917053223,
                                        -0.9963891506195068,
                                        -1.1164650917053223,
                                        -1.1164650917053223,
                                        -0.9963891506195068],
                        'log_Z': -1.0697309164789792,
                        'resampled': 1},
 'toy-min-active-1': {'texts': ['abba', 'cca', 'bcb', 'caba', 'caba', 'caba', 'caba', 'caba'],
                      'log_weights': [-1.7431628704071045,
                                      -2.234959840774536,
                                      -1.7431628704071045,
                                      -1.7431628704071045,
                                      -1.7431628704071045,
                                      -1.7431628704071045,
                                      -1.7431628704071045,
                                      -1.7431628704071045],
                      'log_Z': -1.7929406675262034,
                      'resampled': 1},
 'toy-mixture-alg1-2': {'texts': ['aa', 'babc', 'aba', 'babc', 'abba', 'ca', 'babc', 'caba'],
                        'log_weights': [5.960464477539063e-08,
                                        -5.960464477539063e-08,
                                        0.0,
                                        -5.960464477539063e-08,
                                        -8.940696716308594e-08,
                                        5.960464477539063e-08,
                                        -5.960464477539063e-08,
                                        5.960464477539063e-08],
                        'log_Z': -1.1175869119028903e-08,
                        'resampled': 0},
 'ngram-min-3': {'texts': [[1, 1],
                           [],
                           [0, 1, 1],
                           [0, 1, 1],
                           [0, 1, 1, 0, 0],
                           []],
                 'log_weights': [-0.7342747449874878,
                                 -0.7342747449874878,
                                 -1.1383955478668213,
                                 -1.1383955478668213,
                                 -3.2531259059906006,
                                 -0.7342747449874878],
                 'log_Z': -1.0408725889019552,
                 'resampled': 1},
 'smol-token-0': {'texts': [' **Alice** here. Sp', ' Steve Brownell (Genetic Engineering',
                            ' a Longfellow college student'],
                  'log_weights': [-28.399375915527344, -17.663009643554688, -13.943570137023926],
                  'log_Z': -15.018223661062732,
                  'resampled': 0},
 'smol-local-1': {'texts': [' the renowned Dr. Paul Hoffman', ' John Doe.\n\n', ' iJakeRick.'],
                  'log_weights': [0.0, 0.0, 0.0],
                  'log_Z': None,
                  'resampled': 0},
 'smol-byte-0': {'texts': ['... Al', ' unkno', ' often'],
                 'log_weights': [-20.876035690307617, -math.inf, -21.58989143371582],
                 'log_Z': -21.576038185955706,
                 'resampled': 0},
 'smol-byte-truncate-active-2': {'texts': [' unkno', ' likel', ' Alexa'],
                                 'log_weights': [-0.07511638104915619,
                                                 -0.062012847512960434,
                                                 -0.22792403399944305],
                                 'log_Z': -0.11889950627632118,
                                 'resampled': 0}}


def _check(name: str, got: dict) -> None:
    want = RECORDED[name]
    assert got["texts"] == want["texts"], name
    np.testing.assert_allclose(got["log_weights"], want["log_weights"], rtol=RTOL, atol=ATOL, err_msg=name)
    if want["log_Z"] is None:
        assert got["log_Z"] is None
    else:
        assert math.isclose(got["log_Z"], want["log_Z"], rel_tol=RTOL, abs_tol=ATOL), (name, got["log_Z"])
    assert got["resampled"] == want["resampled"], name


@pytest.mark.parametrize("name", sorted(TOY_CASES))
def test_toy_runs_reproduce(name):
    _check(name, TOY_CASES[name]())


@pytest.fixture(scope="module")
def smol():
    return sj.load_model(SMOL)


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODEL_CASES))
def test_model_runs_reproduce(smol, name):
    _check(name, MODEL_CASES[name](smol))


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HEAL_OFF_CASES))
def test_model_runs_reproduce_without_healing(smol, name):
    _check(name, HEAL_OFF_CASES[name](smol))


if __name__ == "__main__":
    import pprint

    recorded = {name: case() for name, case in TOY_CASES.items()}
    model = sj.load_model(SMOL)
    recorded.update({name: case(model) for name, case in MODEL_CASES.items()})
    text = pprint.pformat(recorded, width=110, sort_dicts=False).replace("-inf", "-math.inf")
    print(f"RECORDED: dict[str, dict] = {text}")
