"""Fault injection for the subprocess tests of a pod (tests/test_pod.py).

Python imports ``sitecustomize`` at start-up from the first folder of sys.path that has one; the tests put this
folder on PYTHONPATH, so the real ``jaxembed`` console script runs with the faults named in
``JAXEMBED_TEST_FAULT`` (comma-separated; nothing set: no effect). ``JAXEMBED_TEST_MARKER`` is a file touched when
a held fault is reached, so that a test acts on an event, not after a sleep:

- ``hold_save=STEP``: Orbax's final rename of checkpoint STEP (its ``*.orbax-checkpoint-tmp*`` folder is
  written) never happens: the marker is touched and the saving thread waits forever (kill -9 during an async save).
- ``slow_writes=SECONDS``: a slow shared disk: the first write to a run file (config.json / config.txt, the plan,
  the length table, the store's manifest) writes half, flushes, sleeps SECONDS, writes the rest, so a reader that
  does not wait for the writer sees half a file.
- ``sigint_after=MODULE:NAME``: Ctrl-C inside the work: the first call of ``MODULE.NAME`` (a function, or a
  method ``Class.method``) returns, the marker is touched and the process sends itself SIGINT, which Python's
  default handler turns into KeyboardInterrupt at once (e.g. ``jaxembed.export:write_safetensors``: the export's
  temporary folder holds model.safetensors then). ``sigints=2``: two SIGINTs, one after the other (Ctrl-C pressed
  twice; each reaches the handler before the next is sent).
"""

import os


def _faults() -> dict:
    out = {}
    for part in os.environ.get("JAXEMBED_TEST_FAULT", "").split(","):
        if part.strip():
            k, _, v = part.strip().partition("=")
            out[k] = v
    return out


def _touch_marker(what: str) -> None:
    path = os.environ.get("JAXEMBED_TEST_MARKER")
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {os.getpid()}\n")


def _install(faults: dict) -> None:
    if "slow_writes" in faults:
        _slow_writes(float(faults["slow_writes"]))
    hooks = {}
    if "hold_save" in faults:
        hooks["orbax.checkpoint._src.path.atomicity"] = lambda m: _hold_save(m, faults["hold_save"])
    if "sigint_after" in faults:
        import signal

        # Ctrl-C reaches a process of the terminal's foreground job, whose SIGINT Python handles; a suite started
        # in the background (`make test &`) passes SIGINT on ignored, and Python then leaves it ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        module, _, name = faults["sigint_after"].partition(":")
        hooks[module] = lambda m: _sigint_after(m, name, int(faults.get("sigints", 1)))
    if hooks:
        _after_import(hooks)


def _sigint_after(module, name: str, count: int) -> None:
    import signal

    *outer, attr = name.split(".")
    owner = module
    for part in outer:
        owner = getattr(owner, part)
    original = getattr(owner, attr)
    fired = []

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        if not fired:
            fired.append(True)
            _touch_marker(f"sigint_after {module.__name__}:{name}")
            for _ in range(count):  # a Python handler runs before os.kill returns (same thread, next bytecode)
                os.kill(os.getpid(), signal.SIGINT)
        return out

    setattr(owner, attr, wrapped)


def _after_import(hooks: dict) -> None:
    """Run hooks[name](module) right after ``name`` is first imported."""
    import importlib.abc
    import sys

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in hooks:
                return None
            sys.meta_path.remove(self)
            try:
                import importlib.util

                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            loader, hook = spec.loader, hooks.pop(name)

            class Loader(importlib.abc.Loader):
                def create_module(self, spec):
                    return loader.create_module(spec)

                def exec_module(self, module):
                    loader.exec_module(module)
                    hook(module)

            spec.loader = Loader()
            return spec

    sys.meta_path.insert(0, Finder())


def _hold_save(atomicity, step: str) -> None:
    cls = atomicity.AtomicRenameTemporaryPath
    original = cls.finalize

    async def finalize(self, *args, **kwargs):
        if os.path.basename(str(self.get_final())) == step:
            import asyncio

            _touch_marker(f"hold_save {step}")
            while True:
                await asyncio.sleep(0.05)
        return await original(self, *args, **kwargs)

    cls.finalize = finalize


def _slow_writes(seconds: float) -> None:
    import builtins
    import io
    import time

    names = ("config.json", "config.txt", "plan.npz", "plan.json", "plan_lengths", "manifest.json")
    real_open = io.open

    class Slow:
        def __init__(self, f):
            self._f, self._first = f, True

        def write(self, data):
            if not self._first:
                return self._f.write(data)
            self._first = False
            half = len(data) // 2
            n = self._f.write(data[:half])
            self._f.flush()
            time.sleep(seconds)
            return n + self._f.write(data[half:])

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def __iter__(self):
            return iter(self._f)

    def slow_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax") and any(
                n in os.fspath(file) for n in names):
            return Slow(f)
        return f

    builtins.open = io.open = slow_open


_f = _faults()
if _f:
    _install(_f)
