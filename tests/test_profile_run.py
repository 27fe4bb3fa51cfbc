"""benchmarks.profile_run: the trace summary per process (synthetic events, no model) and its
argument checks."""

import pytest

from benchmarks.profile_run import parse_args, trace_summary


def _events():
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}]
    host = [{"ph": "X", "pid": 1, "name": "ThunkExecutor::Execute", "dur": 500.0}] * 4
    device = ([{"ph": "X", "pid": 7, "name": "loop_fusion", "dur": 3000.0}] * 6
              + [{"ph": "X", "pid": 7, "name": "MemcpyDtoH", "dur": 10.0}] * 8
              + [{"ph": "X", "pid": 7, "name": "Memcpy HtoD", "dur": 20.0}] * 2)
    return meta + host + device + [{"ph": "i", "pid": 7, "name": "marker"}]


def test_trace_summary_groups_by_process_per_run():
    rows = trace_summary(_events(), runs=2)
    assert [r["process"] for r in rows] == ["/device:GPU:0", "/host:CPU"]  # most time first
    device, host = rows
    assert device["events_per_run"] == 8 and device["ms_per_run"] == pytest.approx((18 + 0.08 + 0.04) / 2)
    assert device["MemcpyDtoH_per_run"] == 4 and device["MemcpyHtoD_per_run"] == 1
    assert device["largest"][0] == ("loop_fusion", 9.0, 3.0)
    assert host["events_per_run"] == 2 and host["MemcpyDtoH_per_run"] == 0


@pytest.mark.parametrize("argv", [["--runs", "0"], ["--trace-runs", "-1"], ["--workload", "bytes-smollm2"]])
def test_bad_arguments_stop_before_loading(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
