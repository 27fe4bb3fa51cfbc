"""`benchmarks/compile_profile.py`'s reading of XLA:CPU's timing logs and of profiler traces: a
kernel's LLVM seconds and run time go to the part of the operation it was fused from (or of its
neighbours, where XLA dropped its name), and only the step program's kernels count."""

import gzip
import json

import pytest

from benchmarks.compile_profile import backend_seconds, kernel_parts, runtime_parts

HLO = """
ENTRY %main {
  %wrapped_add = f32[4]{0} fusion(%p), kind=kLoop, metadata={op_name="jit(_advance)/while/body/resampling/add"}
  %dot_fusion.2 = f32[4]{0} fusion(%p), metadata={op_name="jit(_advance)/byte step/jit(paged_decode)/dot_general"}
  %copy.7 = f32[4]{0} copy(%p)
  %dot.3 = f32[4]{0} dot(%dot_fusion.2, %gte.1), lhs_contracting_dims={0}
  %gte.9 = f32[4]{0} get-tuple-element(%p), index=1
  %select.4 = f32[4]{0} select(%gte.9, %dot.3), metadata={op_name="jit(_advance)/while/body/resampling/select_n"}
}
"""

LOG = """
I1129 cpu_compiler.cc:2091] Compiled LLVM module: __compute_module_wrapped_add_kernel_module time: 9 s (9 s)
I1129 cpu_compiler.cc:1269] Running HLO passes on [jit__advance] for CPU time: 1.5 s (1500000 us) (cumulative: 2 s)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_wrapped_add_kernel_module time: 250 ms (250000 us)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_dot_fusion.2_kernel_module time: 2 s (2000000 us)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_copy.7 time: 500 us (500 us)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_select.4_elemental_kernel_module time: 40 ms (40000 us)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_part_03 time: 1 s (1000000 us)
I1129 cpu_compiler.cc:2094] Compiling [jit__advance] for CPU using JIT time: 3 s (3000000 us)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_wrapped_add_kernel_module time: 7 s (7 s)
"""


def test_kernels_go_to_their_parts_and_other_programs_do_not_count():
    parts = kernel_parts(HLO)
    assert parts["wrapped_add"] == "resampling" and parts["dot_fusion.2"] == "model forward"
    assert parts["copy.7"] == "copies and layout (no op_name)"
    # unnamed: a product of the forward's output is the forward's; a value only resampling reads is resampling's
    assert parts["dot.3"] == "model forward" and parts["gte.9"] == "resampling"
    got = backend_seconds(LOG, HLO)
    assert got["hlo_passes_s"] == 1.5 and got["backend_s"] == 3.0 and got["kernels"] == 5
    # an element-wise emitter's kernel of one instruction is that instruction's; a module part has no one part
    assert got["llvm_s_by_part"] == pytest.approx({
        "resampling": 0.29, "model forward": 2.0, "copies and layout (no op_name)": 0.0005,
        "LLVM module parts (several kernels each)": 1.0})


def test_run_time_goes_to_parts_without_the_nested_kernels(tmp_path):
    event = lambda name, ts, dur, tid=1: {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}
    events = [
        event("wrapped_add", 0, 100), event("copy.7", 10, 30),  # nested: wrapped_add's own time is 70 us
        event("dot.3", 200, 50), event("dot_fusion.2", 0, 40, tid=2),
        event("ThunkExecutor::Execute", 0, 1000, tid=3), event("fusion.99", 5, 5, tid=3),  # another program
    ]
    trace = tmp_path / "perfetto_trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    got = runtime_parts(str(trace), HLO)
    want = {"resampling": 70e-6, "model forward": 90e-6, "copies and layout (no op_name)": 30e-6}
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-12 for k in want)


def test_against_names_a_commit_or_is_refused_before_any_work():
    import subprocess
    import sys

    from benchmarks.common import ROOT
    from benchmarks.compile_profile import commit_of

    assert len(commit_of("HEAD")) == 40 and commit_of("no-such-revision") is None
    done = subprocess.run([sys.executable, "-m", "benchmarks.compile_profile", "--against", "no-such-revision"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "names no commit of this repository" in done.stderr
