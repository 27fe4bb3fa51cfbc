"""What a weight matmul of a byte-level call costs on this CPU, and where inside it the time goes
(issue 18, item 3).

A byte-level model call multiplies 2-40 rows by every weight matrix of the model: the matmuls
read the weights once per call, so their floor is the weights' bytes over the memory bandwidth.
This script times SmolLM2-135M's 30 layers of weight matmuls (the fused shapes the library
runs: qkv [D + 2 kv, D], o [D, D], gate_up [2F, D], down [D, F]; random weights, one buffer
per layer as `load_model` splits them on CPU) through the library's own `_matmul`, for:

* precision: f32 (float32 weights and products) and bf16 (bfloat16 weights, the rows rounded
  to bfloat16 for the product, float32 accumulation: `LanguageModel.with_matmul_dtype`);
* form: how the kernels are stored and multiplied:
  - `out_in`: stored [out, in], as the library stores them, through the library's `_matmul`
    (in bfloat16 on a CPU with AMX at 3 or more rows, that is the weights-left product below);
  - `x_wT`: stored [out, in], always the plain product x @ w^T (the library's form before the
    weights-left product, and its form for float32);
  - `w_xT`: stored [out, in], always the weights-left product w @ x^T
    (`transformer._weights_left`; in float32 its bits differ from x @ w^T);
  - `in_out`: stored [in, out], through `_matmul`;
* rows: the number of rows multiplied at once.

Each row of the table gives the median milliseconds of the 30 layers and the weights' bytes
read per second. The floor row per precision is an XLA sum over the same buffers: how fast this
machine streams them.

`--perf` (Linux `perf` on PATH) also runs each precision and form at `--perf-rows` rows under
`perf record` (attached after a warm-up, for the timed calls only) and sums the CPU samples by symbol: YNNPACK's packing of the weight operand
(`ynn::transpose_*`, `ynn::interleave*`, `ynn::pack*`), YNNPACK's dot kernels (`ynn::dot_*`),
copies (`memmove` / `memcpy`), the kernel (`[k]`) and the rest. XLA:CPU hands these dots to
YNNPACK, which rearranges a weight operand into its kernel's tile layout on every call when the
operand is a runtime buffer.

Run: python -m benchmarks.bench_matmul_forms [--rows 1 2 5 10 20 40] [--repeats 10] [--perf]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.common import markdown_table, save, timed
from smc_jax.models.transformer import F32, _matmul, _weights_left

#: SmolLM2-135M (`shared/reference/models.md`): width, MLP width, KV width (3 heads x 64), layers.
D, F, KV, LAYERS = 576, 1536, 192, 30
PRECISIONS = {"f32": jnp.float32, "bf16": jnp.bfloat16}
FORMS = ("out_in", "x_wT", "w_xT", "in_out")
#: Symbol groups of `--perf`, matched in order on perf's symbol column.
GROUPS = (("ynn packing", r"ynn::(transpose|interleave|pack)"), ("ynn dot kernels", r"ynn::dot_"),
          ("copies", r"mem(move|cpy)"), ("kernel", r"^\[k\]"))


def weights(precision: str, form: str, key: jax.Array, num_layers: int = LAYERS) -> list[list[jax.Array]]:
    """`num_layers` layers of [qkv, o, gate_up, down] kernels, [out, in] ([in, out] for `in_out`), one buffer each."""
    shapes = [(D + 2 * KV, D), (D, D), (2 * F, D), (D, F)]
    layers = []
    for layer in range(num_layers):
        keys = jax.random.split(jax.random.fold_in(key, layer), len(shapes))
        ws = [(jax.random.normal(k, s, jnp.float32) / s[1] ** 0.5).astype(PRECISIONS[precision])
              for k, s in zip(keys, shapes)]
        layers.append([jnp.asarray(w.T).copy() if form == "in_out" else w for w in ws])
    return layers


def layer_matmuls(form: str):
    """The 30 layers' weight matmuls on [rows, D] float32 rows (a residual stream, no attention)."""
    product = {
        "out_in": lambda x, w: _matmul("rd,od->ro", x, w),
        "x_wT": lambda x, w: jnp.einsum("rd,od->ro", x.astype(w.dtype), w, preferred_element_type=F32),
        "w_xT": lambda x, w: _weights_left(x, w),
        "in_out": lambda x, w: _matmul("rd,do->ro", x, w),
    }[form]

    def run(x: jax.Array, layers: list[list[jax.Array]]) -> jax.Array:
        for qkv, o, gate_up, down in layers:
            a = product(x, qkv)
            gate, up = jnp.split(product(x, gate_up), 2, axis=-1)
            x = x + 1e-2 * (product(a[:, :D], o) + product(jax.nn.silu(gate) * up, down))
        return x

    return jax.jit(run)


def streamed(layers: list[list[jax.Array]]) -> jax.Array:
    return sum(jnp.sum(w, dtype=jnp.float32) for ws in layers for w in ws)


def time_forms(rows: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    out = []
    key = jax.random.PRNGKey(0)
    for precision in PRECISIONS:
        for form in FORMS:
            layers = weights(precision, form, key)
            nbytes = sum(w.nbytes for ws in layers for w in ws)
            if form == FORMS[0]:
                summed = jax.jit(streamed)
                t, _, _ = timed(lambda: summed(layers).block_until_ready(), repeats)
                out.append({"precision": precision, "form": "XLA sum (floor)", "rows": "", "ms": t * 1e3,
                            "GB_per_s": nbytes / t / 1e9, "weights_MB": nbytes / 1e6})
            run = layer_matmuls(form)
            for r in rows:
                x = jax.random.normal(jax.random.PRNGKey(r), (r, D), jnp.float32)
                t, _, _ = timed(lambda: run(x, layers).block_until_ready(), repeats)
                out.append({"precision": precision, "form": form, "rows": r, "ms": t * 1e3,
                            "GB_per_s": nbytes / t / 1e9, "weights_MB": nbytes / 1e6})
                print(out[-1], flush=True)
            del layers
    return out


def child(precision: str, form: str, rows: int, repeats: int) -> None:
    """The process `--perf` records: one precision and form; says "ready" after the warm-up
    (perf then attaches) and "done" after `repeats` calls."""
    layers = weights(precision, form, jax.random.PRNGKey(0))
    run = layer_matmuls(form)
    x = jax.random.normal(jax.random.PRNGKey(rows), (rows, D), jnp.float32)
    for _ in range(3):  # compile and warm up
        run(x, layers).block_until_ready()
    print("ready", flush=True)
    time.sleep(1.0)  # perf attaching
    timed(lambda: run(x, layers).block_until_ready(), repeats, warmup=0)
    print("done", flush=True)
    sys.stdin.readline()  # stay alive until perf has stopped


def sample_shares(report: str) -> dict[str, float]:
    """Percent of samples per symbol group, from `perf report --sort sym --stdio` text."""
    shares: Counter[str] = Counter()
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(.*)$", line)
        if not m:
            continue
        percent, symbol = float(m.group(1)), m.group(2).strip()
        symbol = re.sub(r"^\[\.\]\s*", "", symbol)
        group = next((g for g, pattern in GROUPS if re.search(pattern, symbol)), "other")
        shares[group] += percent
    return {g: round(shares[g], 1) for g, _ in GROUPS + (("other", ""),)}


def perf_shares(rows: int, repeats: int) -> list[dict[str, Any]]:
    """Each precision and form in a child process; perf records only its timed calls."""
    out = []
    for precision in PRECISIONS:
        for form in FORMS:
            with tempfile.TemporaryDirectory() as tmp:
                data = os.path.join(tmp, "perf.data")
                proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_matmul_forms", "--child", precision,
                                         form, str(rows), str(repeats)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                if proc.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"the --child process for {precision} {form} failed (exit {proc.wait()})")
                perf = subprocess.Popen(["perf", "record", "-q", "-F", "999", "-p", str(proc.pid), "-o", data],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                proc.stdout.readline()  # "done"
                perf.send_signal(signal.SIGINT)
                perf.wait()
                proc.communicate("\n")
                report = subprocess.run(["perf", "report", "-i", data, "--sort", "sym", "--stdio"],
                                        check=True, capture_output=True, text=True).stdout
            out.append({"precision": precision, "form": form, "rows": rows, **sample_shares(report)})
            print(out[-1], flush=True)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_matmul_forms",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 10, 20, 40])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--perf", action="store_true", help="also the CPU samples by symbol group (Linux perf)")
    parser.add_argument("--perf-rows", type=int, default=10)
    parser.add_argument("--child", nargs=4, metavar=("PRECISION", "FORM", "ROWS", "REPEATS"), help=argparse.SUPPRESS)
    parser.add_argument("--name", default="bench_matmul_forms")
    args = parser.parse_args(argv)
    if min(args.rows) < 1 or args.repeats < 1 or args.perf_rows < 1:
        parser.error("--rows, --repeats and --perf-rows must be >= 1")
    if args.perf and shutil.which("perf") is None:
        parser.error("--perf needs Linux perf on PATH (e.g. apt install linux-perf)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        precision, form, rows, repeats = args.child
        child(precision, form, int(rows), int(repeats))
        return
    rows = time_forms(args.rows, args.repeats)
    appendix = ""
    shares = perf_shares(args.perf_rows, 10 * args.repeats) if args.perf else []
    if shares:
        columns = ["precision", "form", "rows"] + [g for g, _ in GROUPS] + ["other"]
        appendix = ("## CPU samples by symbol group, percent (`perf record` attached for the timed calls only)\n\n"
                    + markdown_table(shares, columns))
    table = save(args.name, rows, ["precision", "form", "rows", "ms", "GB_per_s", "weights_MB"],
                 {"rows": args.rows, "repeats": args.repeats, "perf_rows": args.perf_rows if shares else None,
                  "perf": shares},
                 notes=("SmolLM2-135M's 30 layers of weight matmuls (random weights, one buffer per layer): median ms "
                        "and weight bytes read per second. Forms: out_in, the library's `_matmul` on [out, in] kernels; "
                        "x_wT, the plain product x @ w^T; w_xT, the weights-left product w @ x^T "
                        "(`transformer._weights_left`); in_out, `_matmul` on [in, out] kernels."),
                 appendix=appendix)
    print(table)
    if appendix:
        print(appendix)


if __name__ == "__main__":
    main()
