"""`benchmarks/compile_profile.py`'s reading of XLA:CPU's timing logs: a kernel's LLVM seconds go
to the part of the operation it was fused from, and only the step program's kernels count."""

from benchmarks.compile_profile import backend_seconds, kernel_parts

HLO = """
ENTRY %main {
  %wrapped_add = f32[4]{0} fusion(%p), kind=kLoop, metadata={op_name="jit(_advance)/while/body/resampling/add"}
  %dot_fusion.2 = f32[4]{0} fusion(%p), metadata={op_name="jit(_advance)/byte step/jit(paged_decode)/dot_general"}
  %copy.7 = f32[4]{0} copy(%p)
}
"""

LOG = """
I1129 cpu_compiler.cc:2091] Compiled LLVM module: __compute_module_wrapped_add_kernel_module time: 9 s (9 s)
I1129 cpu_compiler.cc:1269] Running HLO passes on [jit__advance] for CPU time: 1.5 s (1500000 us) (cumulative: 2 s)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_wrapped_add_kernel_module time: 250 ms (250000 us)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_dot_fusion.2_kernel_module time: 2 s (2000000 us)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_copy.7 time: 500 us (500 us)
I1129 cpu_compiler.cc:2094] Compiling [jit__advance] for CPU using JIT time: 3 s (3000000 us)
I1129 ir_compiler.cc:293] Compiled LLVM module: __compute_module_wrapped_add_kernel_module time: 7 s (7 s)
"""


def test_kernels_go_to_their_parts_and_other_programs_do_not_count():
    parts = kernel_parts(HLO)
    assert parts["wrapped_add"] == "resampling" and parts["dot_fusion.2"] == "model forward"
    assert parts["copy.7"] == "copies and layout (no op_name)"
    got = backend_seconds(LOG, HLO)
    assert got["hlo_passes_s"] == 1.5 and got["backend_s"] == 3.0 and got["kernels"] == 3
    assert got["llvm_s_by_part"] == {"resampling": 0.25, "model forward": 2.0, "copies and layout (no op_name)": 0.0005}
