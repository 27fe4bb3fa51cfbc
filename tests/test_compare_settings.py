"""benchmarks.compare_settings: paired A/B ratios of two compare_genlm results (no model)."""

import json

import numpy as np
import pytest

from benchmarks.compare_genlm import ratio_interval
from benchmarks.compare_settings import compare, main, parse_args


def _result(times, calls, runs=None, **settings):
    row = {"workload": "b: byte SMC, toy", "smc_jax_times": list(times), "smc_jax_calls_per_run": list(calls)}
    meta = {"settings": {"runs": runs or len(times), "prefetch": 0, **settings}, "precision": "f32", "layers": "split"}
    return {"meta": meta, "rows": [row, {"workload": "a: scoring, GenLM only", "genlm_s": 1.0}]}


def test_pairing_removes_the_seed_spread_from_the_interval():
    rng = np.random.default_rng(0)
    per_seed = rng.uniform(1.0, 4.0, 12)  # some seeds take 4x longer than others, on both sides
    a = per_seed * (1 + rng.normal(0, 0.01, 12))
    b = 0.9 * per_seed * (1 + rng.normal(0, 0.01, 12))
    paired, unpaired = ratio_interval(b, a, paired=True), ratio_interval(b, a)
    assert paired.value == pytest.approx(b.mean() / a.mean()) == pytest.approx(unpaired.value)
    assert paired.low < 0.9 < paired.high and paired.high < 1  # B is faster, and it shows
    assert unpaired.high > 1  # unpaired, the seed spread hides it
    assert ratio_interval(b, a, paired=True) == paired  # fixed resampling seed: reproducible
    with pytest.raises(ValueError, match="as many values"):
        ratio_interval(b, a[:-1], paired=True)


def test_compare_pairs_workloads_and_names_what_changed():
    a = _result([2.0, 4.0, 3.0], [30, 40, 35])
    b = _result([2.2, 4.4, 3.3], [15, 20, 14], prefetch=4)
    rows, changed = compare(a, b)
    assert [r["workload"] for r in rows] == ["b: byte SMC, toy"]  # GenLM-only rows are skipped
    assert rows[0]["time_ratio"] == pytest.approx(9.9 / 9.0)
    assert rows[0]["calls_ratio"] == pytest.approx(49 / 105)
    assert rows[0]["time_low"] > 1  # every seed is 10% slower: the interval excludes 1
    assert changed == {"prefetch": (0, 4)}
    with pytest.raises(ValueError, match="same --runs"):
        compare(a, _result([1.0, 2.0], [1, 2]))


def test_command_line(tmp_path, capsys):
    for name, times in (("a", [2.0, 4.0, 3.0]), ("b", [1.0, 2.0, 1.5])):
        (tmp_path / f"{name}.json").write_text(json.dumps(_result(times, [10, 12, 11])))
    main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--name", "ab", "--out", str(tmp_path)])
    assert "0.500 [0.500, 0.500]" in capsys.readouterr().out
    saved = json.loads((tmp_path / "ab.json").read_text())
    assert saved["rows"][0]["time_ratio"] == pytest.approx(0.5)
    with pytest.raises(SystemExit):
        parse_args([str(tmp_path / "missing.json"), str(tmp_path / "b.json")])
