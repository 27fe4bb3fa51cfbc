"""Constraint automata: size and compile time of real JSON Schemas, and the cost of a
constraint inside a token-level sampling step.

Part 1 (host only): for the first N schemas of jsonschemabench-glaive2k (sorted by file name),
schema -> regex -> byte DFA with outlines-core (`smc_jax.constraints.json_schema`, compact
whitespace), its states, the compile time, and the token table for SmolLM2's vocabulary
(states x 49152 int32, `token_transitions`) with its build time. Schemas with a keyword the
compiler refuses are listed with the keyword.

Part 2 (sampling): SmolLM2-135M-Instruct under one prompt at the token level, M particles, the
product ensemble; seconds per step of a whole run (compiled once, median of repeats, after a
warm-up) with and without the schema as constraint. The constraint adds one gather per particle
and symbol row to a step; its runs may also take fewer steps (particles die or finish early), so
time per step is the comparable number. valid_json: how many of the finished particles with
positive weight validate against the schema (`jsonschema`). The forced EOS at max_length is on,
so the constraint's viability is length-aware (its horizon): strings close by the limit.

Run: python -m benchmarks.bench_constraints [--schemas 20] [--sample-schemas 3] [--particles 4]
     [--max-length 24] [--repeats 2]
Writes benchmarks/results/bench_constraints.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from benchmarks.common import markdown_table, save, timed
import smc_jax as sj
from smc_jax.bytes.vocab import token_byte_strings
from smc_jax.constraints import json_schema, schema_regex, token_transitions

DATA = Path("/work/shared/data/jsonschemabench-glaive2k")
PROMPT = "Write the arguments of the function call as a JSON object:"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_constraints", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--schemas", type=int, default=20)
    parser.add_argument("--sample-schemas", type=int, default=3)
    parser.add_argument("--particles", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    files = sorted(args.data.glob("*.json"))[: args.schemas]
    smol = sj.load_model("smollm2-135m-instruct")
    vocab = token_byte_strings(smol.tokenizer.hf, vocab_size=smol.config.vocab_size).byte_strings

    rows, compiled = [], []
    for path in files:
        schema = json.loads(path.read_text())
        row = {"schema": path.stem}
        try:
            seconds, _, auto = timed(lambda: json_schema(schema, whitespace=""), repeats=3, warmup=1)
        except ValueError as err:
            row["refused"] = str(err).split(" is not supported")[0]
            rows.append(row)
            continue
        row.update(regex_chars=len(schema_regex(schema, "")), states=auto.num_states, compile_ms=1e3 * seconds)
        start = time.perf_counter()
        table, _ = token_transitions(auto, vocab)
        row.update(token_table_s=time.perf_counter() - start, token_table_mb=table.nbytes / 2**20)
        rows.append(row)
        compiled.append((path.stem, auto))
        print(row, flush=True)

    sample_rows = []
    import jsonschema

    def valid(text: str, schema: dict) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False

    schemas = {path.stem: json.loads(path.read_text()) for path in files}
    for name, auto in compiled[: args.sample_schemas]:
        for constrained in (False, True):
            sampler = sj.EnsembleSampler(
                experts=((smol, PROMPT),), f="product", level="token", num_particles=args.particles,
                max_length=args.max_length, constraint=auto if constrained else None,
            )
            start = time.perf_counter()
            sampler(0, allow_zero_weight=True)
            first = time.perf_counter() - start
            seconds, times, result = timed(lambda: sampler(1, allow_zero_weight=True), repeats=args.repeats, warmup=0)
            steps = result.stats["steps"]
            row = {"schema": name, "constraint": constrained, "states": auto.num_states if constrained else "",
                   "first_call_s": first, "run_s": seconds, "steps": steps, "s_per_step": seconds / steps,
                   "finished_positive": int(np.sum((result.weights > 0) & result.finished)),
                   "valid_json": sum(valid(t, schemas[name]) for t, w, fin in zip(result.texts, result.weights, result.finished)
                                     if w > 0 and fin)}
            sample_rows.append(row)
            print(row, flush=True)

    meta = {"data": str(args.data), "schemas": len(files), "particles": args.particles,
            "max_length": args.max_length, "repeats": args.repeats, "model": "smollm2-135m-instruct",
            "whitespace": "compact (no whitespace between JSON tokens)"}
    appendix = "## Seconds per step, token level, with and without the constraint\n\n" + markdown_table(
        sample_rows, ["schema", "constraint", "states", "first_call_s", "run_s", "steps", "s_per_step", "finished_positive", "valid_json"])
    table = save("bench_constraints", rows,
                 ["schema", "regex_chars", "states", "compile_ms", "token_table_s", "token_table_mb", "refused"], meta,
                 notes=__doc__.split("Run:")[0], appendix=appendix, extra={"sampling": sample_rows})
    print(table)
    print(appendix)


if __name__ == "__main__":
    main()
