"""Token healing on real text (issue 20): bytes at probability 0 before and after healing.

Both embedded models read >= 5,000 bytes of varied text (prose from this README, Python source
from this package, JSON from a results file, and non-ASCII prose: accents, CJK, emoji) with the
default beam (width 5, threshold 0.05), teacher-forced in chunks of CHUNK bytes after an empty
prompt (BOS), with healing off and on (`smc_jax.ByteScorer`, heal=False / True). Reports, per
model and kind of text: the bytes whose conditional is 0 (log-probability -inf), the bytes
healing needed (a back-off) and the total log-probability (finite sums only). GenLM
(genlm-bytes) is not installed here, so no comparison with its heal=True log-probabilities.
Writes benchmarks/results/bench_healing.{json,md}.

Run: python benchmarks/bench_healing.py [--models smollm2-135m-instruct gemma3-270m] [--chunk 256]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's smc_jax and benchmarks

import numpy as np  # noqa: E402

from benchmarks.common import save  # noqa: E402
from smc_jax import ByteScorer, load_model  # noqa: E402

NON_ASCII = (
    "Le cœur a ses raisons que la raison ne connaît point. Über den Wolken muss die Freiheit wohl "
    "grenzenlos sein; Straße, Größe, Ærø, Øresund, señor, ¿qué tal?, naïve café à Noël. "
    "Москва — столица России, а Київ — столиця України. Ελληνικά: καλημέρα κόσμε. "
    "日本語の文章も読めます。東京は大きな都市です。中文：我们一起学习。한국어 문장도 있습니다. "
    "Emoji: 🙂🚀🌍✨ — «guillemets», “curly quotes”, en–dash, ellipsis…, 10 µm, 25 °C, ½ + ¼ = ¾. "
    "Dvořák, Łódź, Kraków, İstanbul, Reykjavík, São Paulo, Zürich, Malmö, Þingvellir, Curaçao."
)


def texts() -> dict[str, bytes]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    prose = "\n".join(line for line in readme.splitlines() if line and line[0].isalpha())
    code = (ROOT / "smc_jax" / "bytes" / "trie.py").read_text(encoding="utf-8")
    data = json.loads((ROOT / "benchmarks" / "results" / "bench_bytes.json").read_text())
    return {
        "prose": prose.encode()[:1536],
        "code": code.encode()[:1536],
        "json": json.dumps(data, indent=1).encode()[:1024],
        "non_ascii": (NON_ASCII * 2).encode()[:1024],
    }


def chunks(data: bytes, size: int) -> list[bytes]:
    out, start = [], 0
    while start < len(data):
        end = min(len(data), start + size)
        while end < len(data) and (data[end] & 0xC0) == 0x80:  # do not split a UTF-8 character
            end -= 1
        out.append(data[start:end])
        start = end
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    corpus = texts()
    rows = []
    for name in args.models:
        model = load_model(name)
        for heal in (True, False):
            scorer = ByteScorer(model, heal=heal)
            for kind, data in corpus.items():
                pieces = chunks(data, args.chunk)
                start = time.perf_counter()
                results = scorer.batch([("", piece) for piece in pieces], batch_size=args.batch)
                seconds = time.perf_counter() - start
                cond = np.concatenate([r.conditionals for r in results])
                finite = np.isfinite(cond)
                rows.append({
                    "model": name, "heal": heal, "text": kind, "bytes": int(cond.size),
                    "zero_prob_bytes": int((~finite).sum()),
                    "healed_bytes": int(sum(r.healed for r in results)),
                    "logprob_finite_sum": float(cond[finite].sum()),
                    "nats_per_byte": float(cond[finite].mean()) if finite.any() else float("nan"),
                    "seconds": seconds,
                })
                print(rows[-1], flush=True)
        for heal in (False, True):
            sel = [r for r in rows if r["model"] == name and r["heal"] == heal]
            rows.append({"model": name, "heal": heal, "text": "all", "bytes": sum(r["bytes"] for r in sel),
                         "zero_prob_bytes": sum(r["zero_prob_bytes"] for r in sel),
                         "healed_bytes": sum(r["healed_bytes"] for r in sel),
                         "logprob_finite_sum": sum(r["logprob_finite_sum"] for r in sel),
                         "seconds": sum(r["seconds"] for r in sel)})
    columns = ["model", "heal", "text", "bytes", "zero_prob_bytes", "healed_bytes", "logprob_finite_sum", "seconds"]
    notes = (
        "Teacher-forced bytes at probability 0 (conditional -inf) with the default beam (width 5, "
        "threshold 0.05), token healing off and on. healed_bytes: bytes that emptied the beam and "
        "were rescued by backing off into a token (smc_jax.bytes.healing). Seconds include "
        "compilation (one program per model and setting, shared by the texts). genlm-bytes is not "
        "installed in this environment: no comparison with its heal=True log-probabilities."
    )
    name = "bench_healing" if len(args.models) > 1 else f"bench_healing_{args.models[0].split('-')[0]}"
    print(save(name, rows, columns, {"chunk": args.chunk, "batch": args.batch, "beam": "width 5, threshold 0.05"}, notes))


if __name__ == "__main__":
    main()
