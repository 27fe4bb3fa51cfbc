"""One of two processes that sample the toy batch of tests/smc/test_batch.py together: the
problems are split over a mesh spanning both processes (`jax.distributed`, CPU devices on
127.0.0.1), and process 0 saves every problem's result.

Run: python -m tests.helpers.problem_processes PROCESS_ID PORT OUT.npz
"""

from __future__ import annotations

import sys

import jax
import numpy as np


def main() -> None:
    process, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process)
    from smc_jax.smc.batch import problem_mesh, sample_problems
    from smc_jax.smc.ensemble import make_ensemble
    from tests.smc.test_batch import FIELDS, SMC8, SPECS, problem

    mesh = problem_mesh()
    assert mesh.size == 2 and len(jax.local_devices()) == 1, (mesh, jax.local_devices())
    groups = [problem(*spec) for spec in SPECS]
    keys = jax.random.split(jax.random.key(2), len(groups))
    results = sample_problems(SMC8, keys, groups, make_ensemble("product", 3), allow_zero_weight=True, mesh=mesh)
    if process == 0:
        np.savez(out, **{f"{b}/{field}": getattr(r, field) for b, r in enumerate(results) for field in FIELDS},
                 **{f"{b}/log_Z": r.log_Z for b, r in enumerate(results)})
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
