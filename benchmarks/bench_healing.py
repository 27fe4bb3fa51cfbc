"""Token healing on real text: bytes at probability 0 with and without healing.

Every part adds rows (with its name in the `part` column) to one table, written to
benchmarks/results/bench_healing.{json,md}.

--part scoring: both embedded models read >= 5,000 bytes of varied text (prose from the
repository's README, Python source from this package, JSON from a results file, and non-ASCII
prose: accents, CJK, emoji) with the default beam (width 5, threshold 0.05), teacher-forced in chunks of CHUNK bytes after an empty
prompt (BOS), with healing off and on (`smc_jax.ByteScorer`, heal=False / True). Reports, per
model and kind of text: the bytes whose conditional is 0 (log-probability -inf), the bytes
healing needed (a back-off) and the total log-probability (finite sums only).

--part genlm (on by default when genlm-bytes is importable: --part scoring genlm): the first
--genlm-bytes bytes of every kind of text, in the same chunks, read by smc_jax (`ByteScorer`,
heal=True) and by genlm-bytes' `ByteBeamState` with heal=True at the same settings (beam width
5, prune threshold 0.05, back-off limit heal_max_backoff = smc_jax's J; GenLM's models built by
`benchmarks.genlm_side.GenLM` on the same GGUF weights and smc_jax's tokenizer): per-byte
conditional log-probabilities (GenLM: `logp_next()` before the byte, then `prune() << byte`)
and the prefix log-probability of each chunk (GenLM: the beam's logZ after the last byte;
smc_jax: `ByteLogprob.prefix`). Differences against TOLERANCE. In the table, zero_prob_bytes,
healed_bytes and seconds are smc_jax's, genlm_* GenLM's.

--part smc: byte-level SMC for f=min and f=product of SmolLM2 x Gemma 3 (one prompt, M=10,
--seeds seeds, --max-length bytes), heal on and off: dead particles (log weight -inf) at the
end and over the steps, bytes healed, log Z-hat.

Run: python -m benchmarks.bench_healing [--part scoring genlm smc] [--models ...] [--chunk 256]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import math
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from benchmarks.common import ROOT, markdown_table, save
from smc_jax import ByteScorer, load_model
from smc_jax.sampler import EnsembleSampler, Expert
from smc_jax.settings import DEFAULTS

#: Per-byte agreement with genlm-bytes (nats): |ours - GenLM| of a byte's conditional log-prob.
TOLERANCE = 1e-2
SMC_PROMPT = "My favorite physicist is"
HAS_GENLM = importlib.util.find_spec("genlm") is not None and importlib.util.find_spec("genlm.bytes") is not None

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


#: The table's columns in order (a run shows those its parts fill); the JSON rows keep every field.
COLUMNS = ("part", "model", "f", "heal", "text", "bytes", "runs", "zero_prob_bytes", "genlm_zero_bytes", "healed_bytes",
           "genlm_heals", "heals", "logprob_finite_sum", "max_abs_diff", "mean_abs_diff", "above_tol", "sum_diff",
           "prefix_diff", "dead_final", "dead_particle_steps", "particle_steps", "zero_weight_runs", "log_Z_mean_finite",
           "log_Z_per_seed", "seconds", "genlm_s")


@dataclasses.dataclass
class Part:
    """One part's rows (each with its `part`), notes, settings and further tables (markdown)."""

    rows: list[dict[str, Any]]
    notes: str
    meta: dict[str, Any]
    appendix: str = ""


def scoring(args: argparse.Namespace) -> Part:
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
                    "part": "scoring", "model": name, "heal": heal, "text": kind, "bytes": int(cond.size),
                    "zero_prob_bytes": int((~finite).sum()),
                    "healed_bytes": int(sum(r.healed for r in results)),
                    "logprob_finite_sum": float(cond[finite].sum()),
                    "nats_per_byte": float(cond[finite].mean()) if finite.any() else float("nan"),
                    "seconds": seconds,
                })
                print(rows[-1], flush=True)
        for heal in (False, True):
            sel = [r for r in rows if r["model"] == name and r["heal"] == heal]
            rows.append({"part": "scoring", "model": name, "heal": heal, "text": "all",
                         "bytes": sum(r["bytes"] for r in sel),
                         "zero_prob_bytes": sum(r["zero_prob_bytes"] for r in sel),
                         "healed_bytes": sum(r["healed_bytes"] for r in sel),
                         "logprob_finite_sum": sum(r["logprob_finite_sum"] for r in sel),
                         "seconds": sum(r["seconds"] for r in sel)})
    notes = (
        "scoring: teacher-forced bytes at probability 0 (conditional -inf) with the default beam (width 5, "
        "threshold 0.05), token healing off and on. healed_bytes: bytes that emptied the beam and "
        "were rescued by backing off into a token (smc_jax.bytes.healing). Seconds include "
        "compilation (one program per model and setting, shared by the texts)."
    )
    return Part(rows, notes, {"chunk": args.chunk, "batch": args.batch, "beam": "width 5, threshold 0.05"})


# --------------------------------------------------------------------------------- GenLM part


def genlm_read(genlm, model, settings, pieces: list[bytes]) -> list[dict]:
    """genlm-bytes, heal=True: each piece read from BOS (a fresh `ByteBeamState`), as
    `genlm_side.genlm_text` reads its text (logp_next, then prune() << byte), with smc_jax's
    back-off limit. Per piece: the conditionals ([len]), logZ after the last byte, heals, seconds."""
    from genlm.bytes import AsyncTokenByteTrie, ByteBeamState, LazyTrieState
    from genlm.bytes.trie import TrieMode

    llm = genlm.llm(model)
    params = genlm.beam_params(model, settings)
    params.heal, params.heal_max_backoff = True, settings.heal_max_backoff
    trie = AsyncTokenByteTrie.from_vocab(llm.byte_vocab, eos_byte_strings=params.eos_byte_strings)

    async def read(piece: bytes) -> dict:
        start = time.perf_counter()
        beam = ByteBeamState([await LazyTrieState.initial(llm, trie, mode=TrieMode.WITH_EOS).materialize()], params)
        start_logz, cond, healed_before = beam.logZ, [], heals[0]
        for byte in piece:
            cond.append(float((await beam.logp_next()).ps[byte]))
            beam = await (beam.prune() << byte)
            if len(beam) == 0:  # healing failed too: the rest of the piece is unreachable
                break
        cond += [-math.inf] * (len(piece) - len(cond))
        logz = beam.logZ if len(beam) else -math.inf
        return {"cond": np.asarray(cond), "prefix": float(logz - start_logz), "heals": heals[0] - healed_before,
                "seconds": time.perf_counter() - start}

    # Count GenLM's successful heals by wrapping its healing step (restored afterwards).
    heals = [0]
    adaptive_heal = ByteBeamState._adaptive_heal

    async def counted(self, next_byte):
        healed = await adaptive_heal(self, next_byte)
        heals[0] += healed is not None
        return healed

    async def run() -> list[dict]:
        out = []
        for piece in pieces:
            genlm.reset()
            out.append(await read(piece))
        await trie.cleanup()
        return out

    ByteBeamState._adaptive_heal = counted
    try:
        return asyncio.run(run())
    finally:
        ByteBeamState._adaptive_heal = adaptive_heal


def compare(args: argparse.Namespace) -> Part:
    from types import SimpleNamespace

    from benchmarks.genlm_side import GenLM

    corpus = {kind: data[: args.genlm_bytes] for kind, data in texts().items()}
    genlm = GenLM(torch_threads=args.torch_threads)
    rows, worst = [], []
    for name in args.models:
        model = load_model(name)
        scorer = ByteScorer(model, heal=True)
        settings = SimpleNamespace(beam_width=scorer.beam.width, prune_threshold=scorer.beam.threshold,
                                   heal_max_backoff=scorer.beam.heal_max_backoff)
        pieces = {kind: chunks(data, args.chunk) for kind, data in corpus.items()}
        flat = [(kind, piece) for kind, ps in pieces.items() for piece in ps]
        start = time.perf_counter()
        ours = scorer.batch([("", piece) for _, piece in flat], batch_size=len(flat))
        ours_s = time.perf_counter() - start
        theirs = genlm_read(genlm, model, settings, [piece for _, piece in flat])
        per_kind: dict[str, list] = {}
        for (kind, piece), a, b in zip(flat, ours, theirs):
            per_kind.setdefault(kind, []).append((piece, a, b))
        for kind in [*pieces, "all"]:
            sel = [x for k in pieces for x in per_kind[k]] if kind == "all" else per_kind[kind]
            a = np.concatenate([x[1].conditionals for x in sel])
            b = np.concatenate([x[2]["cond"] for x in sel])
            both = np.isfinite(a) & np.isfinite(b)
            diff = np.abs(a - b)[both]
            prefix_a = sum(x[1].prefix for x in sel)
            prefix_b = sum(x[2]["prefix"] for x in sel)
            rows.append({
                "part": "genlm", "model": name, "heal": True, "text": kind, "bytes": int(a.size),
                "zero_prob_bytes": int((~np.isfinite(a)).sum()), "genlm_zero_bytes": int((~np.isfinite(b)).sum()),
                "healed_bytes": sum(x[1].healed for x in sel), "genlm_heals": sum(x[2]["heals"] for x in sel),
                "max_abs_diff": float(diff.max()) if diff.size else float("nan"),
                "mean_abs_diff": float(diff.mean()) if diff.size else float("nan"),
                "above_tol": int((diff > TOLERANCE).sum()),
                "sum_ours": float(a[both].sum()), "sum_genlm": float(b[both].sum()),
                "sum_diff": float(a[both].sum() - b[both].sum()),
                "prefix_ours": prefix_a, "prefix_genlm": prefix_b, "prefix_diff": prefix_a - prefix_b,
                "genlm_s": sum(x[2]["seconds"] for x in sel), "seconds": ours_s if kind == "all" else "",
            })
            print(rows[-1], flush=True)
            if kind == "all":
                continue
            for piece, x, y in sel:  # the largest differences, with the bytes around them
                d = np.where(np.isfinite(x.conditionals) & np.isfinite(y["cond"]), np.abs(x.conditionals - y["cond"]), -1.0)
                nonfinite = np.flatnonzero(np.isfinite(x.conditionals) != np.isfinite(y["cond"]))
                for i in [*np.argsort(-d)[:3], *nonfinite[:3]]:
                    worst.append({"model": name, "text": kind, "position": int(i), "byte": repr(piece[i:i + 1]),
                                  "context": repr(piece[max(0, i - 12):i + 4]), "ours": float(x.conditionals[i]),
                                  "genlm": float(y["cond"][i]), "abs_diff": float(abs(x.conditionals[i] - y["cond"][i]))
                                  if np.isfinite(x.conditionals[i]) and np.isfinite(y["cond"][i]) else float("inf")})
    worst = sorted(worst, key=lambda r: -r["abs_diff"])
    appendix = "## genlm: largest per-byte differences (and bytes finite on one side only)\n\n" + markdown_table(
        worst[: args.worst], ["model", "text", "position", "byte", "context", "ours", "genlm", "abs_diff"])
    notes = (
        f"genlm: smc_jax (ByteScorer, heal=True) against genlm-bytes (ByteBeamState, heal=True), the same text "
        f"chunks read from BOS at equal settings (beam width 5, prune threshold 0.05, back-off limit "
        f"{DEFAULTS.replace(level='byte').beam().heal_max_backoff} bytes). Per-byte differences |ours - GenLM| of "
        f"the conditional log-probabilities, over bytes finite on both sides; tolerance {TOLERANCE} nats "
        f"(above_tol: bytes over it). sum_*: the conditionals' sums over those bytes; prefix_*: the "
        f"log-probability of each chunk from the beams' total weights (GenLM: logZ after the last byte), "
        f"summed over the chunks (the JSON rows keep both sides' sums). zero_prob_bytes and healed_bytes: "
        f"smc_jax's; genlm_zero_bytes: bytes GenLM's logp_next gives 0 (GenLM heals the beam after such a "
        f"byte; smc_jax gives it the healed path's probability). seconds: smc_jax's batch of every chunk "
        f"(on the 'all' row), genlm_s: GenLM's, with torch threads = {args.torch_threads}."
    )
    meta = {"chunk": args.chunk, "genlm_bytes_per_kind": args.genlm_bytes, "tolerance": TOLERANCE,
            "torch_threads": args.torch_threads}
    return Part(rows, notes, meta, appendix)


# ----------------------------------------------------------------------------------- SMC part


def smc(args: argparse.Namespace) -> Part:
    smollm2, gemma3 = load_model("smollm2-135m-instruct"), load_model("gemma3-270m")
    experts = (Expert(smollm2, SMC_PROMPT), Expert(gemma3, SMC_PROMPT))
    rows = []
    for f in args.fs:
        for heal in (False, True):
            sampler = EnsembleSampler(experts=experts, f=f, level="byte", num_particles=args.particles,
                                      max_length=args.max_length, heal=heal)
            for seed in range(args.seeds):
                start = time.perf_counter()
                result = sampler(seed, allow_zero_weight=True)
                lw, trace = result.log_weights, result.log_weight_trace
                rows.append({
                    "f": f, "heal": heal, "seed": seed, "dead_final": int((~np.isfinite(lw)).sum()),
                    "dead_particle_steps": int((~np.isfinite(trace)).sum()),
                    "steps": int(trace.shape[0]), "heals": int(result.stats.get("heals", 0)),
                    "log_Z": result.log_Z, "zero_weight_run": bool(not np.isfinite(lw).any()),
                    "seconds": time.perf_counter() - start,
                })
                print(rows[-1], flush=True)
    summary = []
    for f in args.fs:
        for heal in (False, True):
            sel = [r for r in rows if r["f"] == f and r["heal"] == heal]
            if not sel:
                continue
            logz = [r["log_Z"] for r in sel]
            finite = [z for z in logz if np.isfinite(z)]
            summary.append({
                "part": "smc", "f": f, "heal": heal, "runs": len(sel), "dead_final": sum(r["dead_final"] for r in sel),
                "dead_particle_steps": sum(r["dead_particle_steps"] for r in sel),
                "particle_steps": sum(r["steps"] for r in sel) * args.particles,
                "zero_weight_runs": sum(r["zero_weight_run"] for r in sel), "heals": sum(r["heals"] for r in sel),
                "log_Z_mean_finite": float(np.mean(finite)) if finite else float("-inf"),
                "log_Z_per_seed": [round(z, 2) if np.isfinite(z) else "-inf" for z in logz],
            })
    appendix = "## smc: per run\n\n" + markdown_table(
        rows, ["f", "heal", "seed", "dead_final", "dead_particle_steps", "steps", "heals", "log_Z", "zero_weight_run", "seconds"])
    notes = (
        f"smc: byte-level SMC, SmolLM2 x Gemma 3 under {SMC_PROMPT!r}, M = {args.particles}, max_length "
        f"{args.max_length} bytes, default beam (width 5, threshold 0.05), seeds 0..{args.seeds - 1}, token "
        f"healing off and on. dead_final: particles with log weight -inf at the end; dead_particle_steps: "
        f"-inf entries of the log-weight trace over all steps (particles dead at a step, before resampling "
        f"replaces them); zero_weight_runs: runs with every particle dead (log Z-hat = -inf); heals: bytes "
        f"and forced ends of string (EOS at the length limit) healed along the particles' histories, summed "
        f"over experts; log_Z_mean_finite: the mean log Z-hat over runs where it is finite. Seconds (per "
        f"run, the first run of a setting includes compilation) are indicative only: see the load average "
        f"under Settings."
    )
    meta = {"smc_particles": args.particles, "smc_max_length": args.max_length, "smc_seeds": args.seeds,
            "smc_prompt": SMC_PROMPT, "smc_fs": args.fs}
    return Part(summary, notes, meta, appendix)


PARTS = {"scoring": scoring, "genlm": compare, "smc": smc}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_healing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", nargs="+", choices=["scoring", "genlm", "smc"],
                        default=["scoring", "genlm"] if HAS_GENLM else ["scoring"])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--genlm-bytes", type=int, default=256, help="bytes of each kind of text read by both sides")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--worst", type=int, default=12, help="rows of the largest-differences table")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--particles", type=int, default=10)
    parser.add_argument("--max-length", type=int, default=40)
    parser.add_argument("--fs", nargs="+", choices=["min", "product"], default=["min", "product"], help="smc: ensembles")
    args = parser.parse_args()
    if "genlm" in args.part and not HAS_GENLM:
        raise SystemExit("genlm-bytes is not installed: pip install -e '.[genlm]'")
    parts = [PARTS[name](args) for name in dict.fromkeys(args.part)]
    rows = [row for part in parts for row in part.rows]
    columns = [c for c in COLUMNS if any(c in row for row in rows)]
    meta = {"parts": list(dict.fromkeys(args.part)), "models": args.models}
    for part in parts:
        meta.update(part.meta)
    notes = "\n\n".join(part.notes for part in parts)
    appendix = "\n\n".join(part.appendix for part in parts if part.appendix)
    print(save("bench_healing", rows, columns, meta, notes, appendix))


if __name__ == "__main__":
    main()
