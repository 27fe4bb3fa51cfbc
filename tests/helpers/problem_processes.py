"""One of two processes that sample the toy batch of tests/smc/test_batch.py together: the
problems are split over a mesh spanning both processes (`jax.distributed`, CPU devices on
127.0.0.1), each problem's particles over PARTICLES devices of one process (set
XLA_FLAGS=--xla_force_host_platform_device_count=PARTICLES), and process 0 saves every
problem's result.

Run: python -m tests.helpers.problem_processes PROCESS_ID PORT OUT.npz PARTICLES
"""

from __future__ import annotations

import sys

import jax
import numpy as np


def main() -> None:
    process, port, out, particles = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process)
    from smc_jax.smc.batch import problem_mesh, problem_results, run_problems, stack_problems
    from smc_jax.smc.ensemble import make_ensemble
    from tests.smc.test_batch import FIELDS, SMC8, SPECS, problem

    mesh = problem_mesh(particles=particles)
    assert dict(mesh.shape) == {"problems": 2, "particles": particles}, mesh
    assert len(jax.local_devices()) == particles, jax.local_devices()
    groups = [problem(*spec) for spec in SPECS]
    keys = jax.random.split(jax.random.key(2), len(groups))
    experts, shared = stack_problems(groups)
    state = run_problems(SMC8, keys, experts, shared, make_ensemble("product", 3), mesh)
    # This process holds its two problems' particles split over its devices.
    shards = {tuple(shard.data.shape) for shard in state.log_weights.addressable_shards}
    assert shards == {(2, SMC8.num_particles // particles)}, shards
    results = problem_results(SMC8, state, groups, allow_zero_weight=True)
    if process == 0:
        np.savez(out, **{f"{b}/{field}": getattr(r, field) for b, r in enumerate(results) for field in FIELDS},
                 **{f"{b}/log_Z": r.log_Z for b, r in enumerate(results)})
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
