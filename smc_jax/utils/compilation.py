"""Compiling the library's programs: `jit` (with the library's XLA options), counting XLA
compilations, so benchmarks and tests can show a run does not recompile, and keeping compiled
programs on disk, so a new process need not compile them again."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

#: The event JAX records once per backend (XLA) compilation.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

#: XLA:CPU options of every program the library compiles on a CPU backend. Its element-wise
#: fusion emitters, not its MLIR ones, emit the byte step program's kernels in less time (its
#: compile 0.74x, the token program's 0.80x) and the programs run as fast.
COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


class jit:
    """`jax.jit(fn, **kwargs)` with the library's COMPILER_OPTIONS where the default backend is
    the CPU (elsewhere the plain jit). JAX takes compiler options on a top-level program only,
    so a call inside another jit (a user's own jit, or the library's) uses the plain jit; the
    outer program's options apply to it."""

    def __init__(self, fn: Callable, **kwargs: Any):
        self.top = jax.jit(fn, compiler_options=COMPILER_OPTIONS, **kwargs)
        self.nested = jax.jit(fn, **kwargs)
        functools.update_wrapper(self, fn)

    def _program(self) -> Any:
        return self.top if jax.default_backend() == "cpu" else self.nested

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
            return self.nested(*args, **kwargs)
        try:
            return self._program()(*args, **kwargs)
        except ValueError as error:  # inside another jit with untraced arguments (constants)
            if "compiler_options" not in str(error):
                raise
            return self.nested(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # trace, lower, eval_shape, ...: the top-level program's
        if name in ("top", "nested"):  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._program(), name)


@dataclasses.dataclass
class CompilationCounter:
    count: int = 0
    seconds: float = 0.0


@contextlib.contextmanager
def count_compilations() -> Iterator[CompilationCounter]:
    """Counts XLA compilations (and their seconds) inside the `with` block."""
    counter = CompilationCounter()

    def listener(event: str, duration: float, **_) -> None:
        if event == BACKEND_COMPILE_EVENT:
            counter.count += 1
            counter.seconds += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


#: Programs that compile in less time are not written to the persistent cache. JAX's own
#: threshold (1 s) leaves out the prompt prefills, about 0.5 s each on a 2-core CPU, which then
#: compile in every process; below this one a program costs less to compile than to look up.
MIN_CACHED_COMPILE_S = 0.2
_JAX_MIN_CACHED_COMPILE_S = 1.0  # jax_persistent_cache_min_compile_time_secs's default


def use_persistent_cache(directory: str | Path) -> bool:
    """Keep XLA's compiled programs in `directory` (JAX's persistent compilation cache): a later
    process that builds the same program (same shapes, settings and JAX version) loads it
    instead of compiling it. Call before the first compilation. A cache directory the user chose
    (`JAX_COMPILATION_CACHE_DIR` or `jax.config`) is left alone. Programs that compile in at least
    MIN_CACHED_COMPILE_S are kept, unless the user changed JAX's threshold.

    Returns
    -------
    bool
        Whether `directory` is now the cache.
    """
    if jax.config.jax_persistent_cache_min_compile_time_secs == _JAX_MIN_CACHED_COMPILE_S:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_CACHED_COMPILE_S)
    if jax.config.jax_compilation_cache_dir:
        return False
    jax.config.update("jax_compilation_cache_dir", str(Path(directory).expanduser()))
    return True


@functools.cache
def _source_digest() -> str:
    """SHA-256 of the package's source files: a stored program is for this code only."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def program_store() -> Path | None:
    """Where `stored_jit` keeps traced programs: `exported/` inside the persistent compilation
    cache's directory (none without one)."""
    directory = jax.config.jax_compilation_cache_dir
    return Path(directory).expanduser() / "exported" if directory else None


class stored_jit:
    """`jax.jit(fn, static_argnums, donate_argnums)` that keeps the traced and lowered program
    on disk (`jax.export`), so a new process skips tracing and lowering, which take tens of
    seconds for a byte-SMC program; with the persistent compilation cache it also skips compiling.

    A program is stored under a key of everything it is made from: the function, the static
    arguments' repr, the other arguments' tree (pickled, with its static fields) and leaf
    shapes and dtypes, the JAX version and backend, and this package's source. Arguments laid
    out over several devices, traced arguments (a call inside another jit), or a tree that
    cannot be pickled use the plain jit.

    Parameters
    ----------
    fn : callable
        The function (its result a pytree).
    static_argnums : tuple of int
        Its static (hashable) arguments, as for `jax.jit`.
    donate_argnums : tuple of int
        The arguments whose buffers it may reuse, as for `jax.jit`.
    """

    def __init__(self, fn: Callable, *, static_argnums: tuple[int, ...] = (), donate_argnums: tuple[int, ...] = ()):
        self.fn, self.static, self.donate = fn, tuple(static_argnums), tuple(donate_argnums)
        self.jitted = jit(fn, static_argnums=self.static, donate_argnums=self.donate)
        self._programs: dict[Any, Any] = {}
        functools.update_wrapper(self, fn)

    def trace(self, *args: Any):
        """The plain jit's `trace` (for inspection: the stored program is the same)."""
        return self.jitted.trace(*args)

    def lower(self, *args: Any):
        """The plain jit's `lower` (for inspection: the stored program is the same)."""
        return self.jitted.lower(*args)

    def __call__(self, *args: Any) -> Any:
        program, leaves = self._program(args)
        if program is None:
            return self.jitted(*args)
        call, out_tree, out_avals = program
        out = call(*(_raw(x) for x in leaves))
        return jax.tree.unflatten(out_tree, [_wrap(y, aval) for y, aval in zip(out, out_avals)])

    def out_shapes(self, *args: Any) -> Any:
        """The result's tree of `jax.ShapeDtypeStruct` for `args` (arrays or `jax.ShapeDtypeStruct`),
        read from the stored program where there is one (nothing traced), else traced."""
        program, _ = self._program(args)
        if program is None:
            return self.jitted.trace(*args).out_info
        _, out_tree, out_avals = program
        return jax.tree.unflatten(out_tree, [_spec(aval) for aval in out_avals])

    def precompile(self, *args: Any) -> None:
        """Compiles the program for `args` (arrays or `jax.ShapeDtypeStruct`) without running it:
        a later call with arguments of these shapes finds it compiled."""
        program, leaves = self._program(args)
        if program is None:
            self.jitted.trace(*args).lower().compile()
        else:
            program[0].lower(*(_raw_spec(_aval(x)) for x in leaves)).compile()

    def _program(self, args: tuple) -> tuple[Any, list]:
        """The stored program for `args` (read, or exported and stored, once per process) and the
        dynamic arguments' leaves; None where the plain jit is used."""
        store = program_store()
        dynamic = tuple(a for i, a in enumerate(args) if i not in self.static)
        leaves, tree = jax.tree.flatten(dynamic)
        if store is None or not all(_storable(x) for x in leaves):
            return None, leaves
        statics = tuple(args[i] for i in self.static)
        avals = tuple(_aval(x) for x in leaves)
        placed = (x.sharding for x in leaves if getattr(x, "sharding", None) is not None)
        device = next((next(iter(sharding.device_set)) for sharding in placed), jax.devices()[0])
        memo = (statics, tree, avals, device)
        program = self._programs.get(memo)
        if program is None:
            program = self._programs[memo] = self._load(store, statics, dynamic, tree, avals, device)
        return (None if program is _UNSTORABLE else program), leaves

    def _load(self, store: Path, statics, dynamic, tree, avals, device):
        try:
            tree_bytes = _canonical_pickle(tree)
        except Exception:  # a static field that cannot be pickled (or a cycle): no stable key
            return _UNSTORABLE
        key = hashlib.sha256(repr((
            self.fn.__module__, self.fn.__qualname__, repr(statics), avals, jax.__version__, jax.default_backend(),
            str(jax.devices()[0].device_kind), jax.config.jax_enable_x64, str(jax.config.jax_default_matmul_precision),
            _source_digest(),
        )).encode() + tree_bytes).hexdigest()[:32]
        path = store / f"{self.fn.__name__.strip('_')}-{key}.jaxexport"
        # Flat leaves in and out (PRNG keys as their raw data): the stored program needs no
        # pytree or dtype registry to be read back; the output's tree is pickled beside it.
        dynamic_at = [i for i in range(len(statics) + len(dynamic)) if i not in self.static]
        donated = _flat_indices(dynamic, [dynamic_at.index(i) for i in self.donate])
        record = _read(path)
        if record is None:  # not stored yet (or unreadable: stored again)
            made = {}

            def flat(*raw):
                args = list(jax.tree.unflatten(tree, [_wrap(x, aval) for x, aval in zip(raw, avals)]))
                for i, value in zip(self.static, statics):
                    args.insert(i, value)
                out, made["out_tree"] = jax.tree.flatten(self.fn(*args))
                made["out_avals"] = tuple(_aval(y) for y in out)
                return [_raw(y) for y in out]

            blob = jax.export.export(jax.jit(flat))(*(_raw_spec(aval) for aval in avals)).serialize()
            try:
                data = pickle.dumps({**made, "program": bytes(blob)})
                store.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(f".{os.getpid()}.tmp")
                partial.write_bytes(data)
                partial.replace(path)  # atomic: a concurrent reader sees the whole file or none
            except Exception:  # an output tree that cannot be pickled, or a store we cannot write
                return _UNSTORABLE
            record = _read(path)
            if record is None:
                return _UNSTORABLE
        exported, out_tree, out_avals = record
        # Every argument on the one device, committed or not, host values too: one program.
        on_device = jax.sharding.SingleDeviceSharding(device)
        call = jit(exported.call, donate_argnums=donated, in_shardings=on_device, out_shardings=on_device)
        return call, out_tree, out_avals


def _canonical_pickle(value: Any) -> bytes:
    """`value` pickled without memo references, so equal values give equal bytes whether or not
    their parts are shared objects (a model read back from the weights cache shares fewer of
    its config's strings and tuples than one just converted, which gave it another key)."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.DEFAULT_PROTOCOL)
    pickler.fast = True  # no memo: every object written out in full (cycles raise)
    pickler.dump(value)
    return buffer.getvalue()


def _read(path: Path) -> tuple[jax.export.Exported, Any, tuple] | None:
    """A stored program, its output's tree and leaf avals (from the user's own cache directory),
    or None where there is no readable one."""
    try:
        record = pickle.loads(path.read_bytes())
        return jax.export.deserialize(bytearray(record["program"])), record["out_tree"], record["out_avals"]
    except Exception:  # missing, cut short or written by other code: stored again
        return None


def _is_key(dtype: Any) -> bool:
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _aval(x: Any) -> tuple:
    """(shape, dtype name, weak type, PRNG implementation or None) of a leaf (Python numbers too)."""
    aval = jax.typeof(x)
    impl = None
    if _is_key(aval.dtype):  # an abstract key (jax.ShapeDtypeStruct) has its implementation in its dtype only
        impl = aval.dtype._impl.name if isinstance(x, jax.ShapeDtypeStruct) else str(jax.random.key_impl(x))
    return (tuple(aval.shape), str(aval.dtype), bool(aval.weak_type), impl)


def _raw(x: Any) -> Any:
    """A leaf as plain numbers: a PRNG key as its key data."""
    return jax.random.key_data(x) if _is_key(getattr(x, "dtype", None)) else x


def _wrap(x: Any, aval: tuple) -> Any:
    """The inverse of `_raw` for a leaf of `aval`."""
    return x if aval[3] is None else jax.random.wrap_key_data(x, impl=aval[3])


def _spec(aval: tuple) -> jax.ShapeDtypeStruct:
    """The `jax.ShapeDtypeStruct` of a leaf of `aval` (a PRNG key's with its key dtype)."""
    shape, dtype, weak, impl = aval
    if impl is None:
        return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), weak_type=weak)
    return jax.ShapeDtypeStruct(shape, jax.random.key(0, impl=impl).dtype)


def _raw_spec(aval: tuple) -> jax.ShapeDtypeStruct:
    """The `jax.ShapeDtypeStruct` of `_raw` of a leaf of `aval` (a PRNG key's as its data)."""
    shape, _, _, impl = aval
    if impl is None:
        return _spec(aval)
    one = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl)))  # the data of one key
    return jax.ShapeDtypeStruct(shape + one.shape, one.dtype)


_UNSTORABLE = object()


def _storable(x: Any) -> bool:
    """Whether a stored program can take this leaf: a value (not traced) on one device."""
    if isinstance(x, jax.core.Tracer):  # called inside another jit: that program holds this one
        return False
    sharding = getattr(x, "sharding", None)
    return sharding is None or len(sharding.device_set) == 1


def _flat_indices(dynamic: tuple, positions: list[int]) -> tuple[int, ...]:
    """The flat leaf indices of the arguments at `positions` of `dynamic`."""
    out, start = [], 0
    for i, arg in enumerate(dynamic):
        n = len(jax.tree.leaves(arg))
        if i in positions:
            out.extend(range(start, start + n))
        start += n
    return tuple(out)
