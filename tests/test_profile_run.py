"""benchmarks.profile_run: the trace summary per process (synthetic events, no model) and its
argument checks."""

import pytest

from benchmarks.profile_run import device_idle, hlo_sources, parse_args, self_times, time_by_source, trace_summary


def _events():
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}]
    host = [{"ph": "X", "pid": 1, "name": "ThunkExecutor::Execute", "dur": 500.0}] * 4
    device = ([{"ph": "X", "pid": 7, "name": "loop_fusion", "dur": 3000.0}] * 6
              + [{"ph": "X", "pid": 7, "name": "MemcpyDtoH", "dur": 10.0}] * 8
              + [{"ph": "X", "pid": 7, "name": "Memcpy HtoD", "dur": 20.0}] * 2
              + [{"ph": "X", "pid": 7, "name": "MemcpyD2H", "dur": 10.0}] * 2)
    return meta + host + device + [{"ph": "i", "pid": 7, "name": "marker"}]


def test_trace_summary_groups_by_process_per_run():
    rows = trace_summary(_events(), runs=2)
    assert [r["process"] for r in rows] == ["/device:GPU:0", "/host:CPU"]  # most time first
    device, host = rows
    assert device["events_per_run"] == 9 and device["ms_per_run"] == pytest.approx((18 + 0.08 + 0.04 + 0.02) / 2)
    assert device["MemcpyDtoH_per_run"] == 5 and device["MemcpyHtoD_per_run"] == 1  # CUPTI's "D2H" spelling too
    assert device["largest"][0] == ("loop_fusion", 9.0, 3.0)
    assert host["events_per_run"] == 2 and host["MemcpyDtoH_per_run"] == 0


@pytest.mark.parametrize("argv", [["--runs", "0"], ["--trace-runs", "-1"], ["--workload", "bytes-smollm2"],
                                  ["--layer-loop", "partly"], ["--layers", "flat"],
                                  ["--summarize", "no-such-trace.json.gz"], ["--hlo", "module.txt"],
                                  ["--prefetch", "-1"], ["--prefetch", "4", "--prefetch-slots", "0"]])
def test_bad_arguments_stop_before_loading(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_prefetch_options_are_compare_genlms():
    args = parse_args([])
    assert (args.prefetch, args.prefetch_rows) == (0, 0)  # off, as in compare_genlm
    args = parse_args(["--prefetch", "4", "--prefetch-rows", "8", "--prefetch-children", "0"])
    assert (args.prefetch, args.prefetch_rows, args.prefetch_children) == (4, 8, 0)


def test_device_idle_sums_the_gaps_inside_each_run_by_the_event_after_them():
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}]
    runs = [{"ph": "X", "pid": 1, "name": "jit__run:XLA GPU module", "ts": t, "dur": 100.0} for t in (0.0, 1000.0)]
    other = [{"ph": "X", "pid": 1, "name": "jit_other:XLA GPU module", "ts": 500.0, "dur": 100.0}]
    # run 1: busy 10-30 and 20-40 (overlapping: 30 busy), gap 20 before "copy", busy 60-70
    # run 2: busy 1000-1050, gap 30 before "gemm", busy 1080-1090; a kernel outside both runs
    kernels = [(10, 20, "a"), (20, 20, "b"), (60, 10, "copy"), (1000, 50, "a"), (1080, 10, "gemm"), (550, 5, "x")]
    device = [{"ph": "X", "pid": 7, "name": n, "ts": float(t), "dur": float(d)} for t, d, n in kernels]
    idle = device_idle(meta + runs + other + device)
    assert idle["wall_ms"] == pytest.approx(0.1) and idle["device_events"] == 2.5
    assert idle["busy_ms"] == pytest.approx((0.040 + 0.060) / 2) and idle["idle_ms"] == pytest.approx((0.020 + 0.030) / 2)
    assert dict(idle["idle_before"]) == {"gemm": pytest.approx(0.015), "copy": pytest.approx(0.010)}
    assert device_idle(meta + runs) is None  # no device events: a CPU trace


#: The tail of an optimized HLO text dump: two operations made at two source lines.
HLO = """HloModule jit__run

  %log_add_fusion.3 = f32[2,5]{1,0} fusion(%p), kind=kLoop, metadata={op_name="jit(_run)/add" stack_frame_id=2}
  ROOT %ynn_fusion.7 = f32[2,9]{1,0} fusion(%a, %b), metadata={op_name="jit(_run)/dot_general" stack_frame_id=3}
  %copy.1 = f32[2]{0} copy(%c)

FileNames
1 "/home/user/smc_jax/bytes/sumtree.py"
2 "/home/user/smc_jax/models/transformer.py"

FunctionNames
1 "_logaddexp"
2 "_matmul"

FileLocations
1 {file_name_id=1 function_name_id=1 line=39 end_line=39 column=4 end_column=9}
2 {file_name_id=2 function_name_id=2 line=115 end_line=115 column=4 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=1 parent_frame_id=1}
3 {file_location_id=2 parent_frame_id=2}
"""


def test_own_time_by_source_line_counts_nested_events_once():
    sources = hlo_sources(HLO)
    assert sources == {"log_add_fusion.3": "smc_jax/bytes/sumtree.py:39 _logaddexp",
                       "ynn_fusion.7": "smc_jax/models/transformer.py:115 _matmul"}
    # thread 1: a loop of 100 us holding a matmul (60) and a log-add (10), then a copy (5);
    # thread 2: a matmul (30) and the host's wait for the whole program (500, left out)
    X = lambda tid, name, ts, dur: {"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": ts, "dur": dur}
    events = [X(1, "while.4", 0.0, 100.0), X(1, "ynn_fusion.7", 10.0, 60.0), X(1, "log_add_fusion.3", 75.0, 10.0),
              X(1, "copy.1", 100.0, 5.0), X(2, "ynn_fusion.7", 0.0, 30.0),
              X(2, "ThunkExecutor::Execute (wait for completion)", 40.0, 500.0)]
    own = {(e["tid"], e["name"]): t for e, t in self_times(events)}
    assert own[1, "while.4"] == 30.0 and own[1, "ynn_fusion.7"] == 60.0 and own[1, "copy.1"] == 5.0
    lines = dict(time_by_source(events, sources, runs=2))
    assert lines == {"smc_jax/models/transformer.py:115 _matmul": pytest.approx(0.045),
                     "while.4": pytest.approx(0.015), "smc_jax/bytes/sumtree.py:39 _logaddexp": pytest.approx(0.005),
                     "copy.1": pytest.approx(0.0025)}
