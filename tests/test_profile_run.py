"""benchmarks.profile_run: the trace summary per process (synthetic events, no model) and its
argument checks."""

import pytest

from benchmarks.profile_run import device_idle, parse_args, trace_summary


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
                                  ["--summarize", "no-such-trace.json.gz"]])
def test_bad_arguments_stop_before_loading(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)


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
