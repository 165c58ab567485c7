"""vLLM's and SGLang's Triton GDN / KDA kernel files, loaded from their PyPI wheels, run in Triton's interpreter.

Neither engine's import tree installs here (CUDA builds, hundreds of dependencies), but their Gated DeltaNet
kernel files need only ``torch``, ``triton`` and a few helpers of their own package. :func:`load` reads them
straight from the wheel that ``make peers`` downloads (``$GDN2_PEERS/wheels``; :data:`WHEELS`), so nothing of
either engine is installed or committed:

* **Found:** the wheel in ``$GDN2_PEERS/wheels`` (default ``$XDG_CACHE_HOME/gdn2-oracle/peers/wheels``); a
  missing one is a ValueError naming ``make peers`` and the folder (:func:`find_wheel`).
* **Extracted:** only the kernel folders (:attr:`Engine.folders`) into ``$XDG_CACHE_HOME/gdn2-oracle/engines/
  <engine>-<sha256 of the wheel, 16 hex>``: another wheel gets another folder, a folder is written once
  (:func:`extract`).
* **Imported under the engine's own names** (the files import each other as ``sglang.kernels...`` or
  relatively), with, only for the duration of the load (:func:`engine_modules`), empty package modules in
  place of the wheel's ``__init__.py`` (which import the whole engine: the scheduler, the model executor, CUDA
  extensions) and the stand-ins below; afterwards every ``vllm.*`` / ``sglang.*`` entry is taken out of
  ``sys.modules`` again (and any that was there before put back), and the loaded modules live on in the
  :class:`Loaded` this module keeps per engine.

The stand-ins, each for an import the kernel files make (vLLM 0.33.0, SGLang 0.5.23):

* ``vllm.triton_utils`` -- ``tl``, ``triton``, ``tldevice``: vLLM's import guard for Triton (its own module imports
  ``vllm.platforms`` and the logger); here Triton itself.
* ``vllm.platforms.current_platform`` -- every ``is_*`` False: ``ops/utils.py`` asks ``is_cuda_alike()`` for its
  device, ``fused_recurrent.py`` ``is_cuda()`` / ``is_device_capability_family()`` for a Blackwell path,
  ``chunk_scaled_dot_kkt.py`` ``is_rocm()``; the real module detects a GPU through the whole platform layer.
* ``vllm.utils.math_utils`` (``cdiv``, ``next_power_of_2``, ``RCP_LN2`` = 1 / ln 2), ``vllm.utils.platform_utils``
  (``num_compute_units``: 1), ``vllm.utils.torch_utils`` (``async_tensor_h2d``: a plain ``.to``),
  ``vllm.utils.gpu_sync_debug`` (``gpu_sync_allowed``: a null context): helpers whose real modules import
  vLLM's configuration and CUDA utilities.
* ``vllm.model_executor.custom_op.CustomOp`` (an ``nn.Module`` with a no-op ``register``): ``kda.py`` defines
  its gated RMSNorm layer on it at import.
* ``sglang.srt.utils`` (``is_gfx95_supported`` etc. False) and ``sglang.srt.utils.common.torch_release``: the
  real package imports SGLang's server runtime.

What the load changes after the import (:func:`fix_loaded`, each a workaround for running here, not a change of a
kernel's arithmetic):

* SGLang's ``fla/utils.py`` builds ``custom_device_ctx`` from ``torch.cpu.device``, which does not exist: its
  ``input_guard`` gets a null context on the CPU.
* Module-level aliases of Triton builtins (``exp = tl.exp`` in both engines' ``op.py``, imported by the kernels as
  ``exp``): the interpreter converts ``tl.*`` when it runs a kernel, not such aliases ("Did you forget to add
  @triton.jit?"); each alias becomes the builtin called with the interpreter's semantic, as the interpreter does
  for ``tl.exp`` itself.

Triton interpreter fixes (:func:`install_interpreter_fixes`, on top of kernels/triton_interpret.py's shims: the
largest-block autotune config, loop indices with ``.to``, one launch at a time), installed when an engine loads:

* masked load / store take the mask as bool: the interpreter makes ``bool_vector & (int_scalar < constexpr)`` an
  int32 mask (a scalar comparison comes back as an integer, and ``&`` keeps the wider type), which its ``load``
  / ``store`` refuse;
* bfloat16 arithmetic. The interpreter keeps bfloat16 as raw 16-bit integers (NumPy has no bfloat16) and only its
  casts know that: ``tl.dot`` multiplies the bit patterns (``np.matmul`` on uint16: errors of order 1e9,
  kernels/triton_interpret.py's ``BF16_DOT_NOTE``), elementwise operations on bfloat16 values add and multiply
  integers (overflow, NaN), and a float32 -> bfloat16 cast truncates toward zero (its round-to-nearest path does
  not carry a mantissa overflow into the exponent). The fixes: bfloat16 operands of ``tl.dot`` become float32
  (bfloat16 products are exact in float32, accumulated in float32, as on tensor cores); elementwise operations
  on bfloat16 compute on the float32 values and round the result back to bfloat16; float32 -> bfloat16 casts
  round to nearest even (:func:`bfloat16_bits`, bit-identical to torch's). Measured on vLLM's chunk kernel in
  bfloat16 (B = 2, T = 100, H = 2, HV = 4, K = 16, V = 32; relative error against a float64 token loop): o and
  the final state non-finite with the dot fix alone, o 1.3e-2 / state 9.0e-3 (a systematic shrink read as "extra
  decay") with truncating casts, 3.7e-3 / 3.2e-3 with all three (the bfloat16 tolerance: 1.3e-2 / 3.9e-3; what is
  left is vLLM's own bfloat16 intermediates). So the errors of order 1e9 seen before were the interpreter's, not
  vLLM's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import math
import os
import sys
import types
import zipfile
from pathlib import Path

from . import triton_interpret

PEERS_ENV = "GDN2_PEERS"  # the folder make peers fills (wheels/ holds the engines' wheels)
_MAKE = "run `make peers` (it downloads the wheels into $GDN2_PEERS/wheels)"


@dataclasses.dataclass(frozen=True)
class Engine:
    """An engine whose kernel files are read from its wheel: the wheel's file name pattern, the folders of it to
    extract, and the package modules (empty ``__init__``) and stand-ins its files import."""

    name: str
    version: str
    wheel: str
    folders: tuple
    packages: tuple


WHEELS = {
    "vllm": Engine("vllm", "0.33.0", "vllm-0.33.0-*.whl", ("vllm/third_party/flash_linear_attention/",),
                   ("vllm", "vllm.third_party", "vllm.third_party.flash_linear_attention",
                    "vllm.third_party.flash_linear_attention.ops")),
    "sglang": Engine("sglang", "0.5.23", "sglang-0.5.23-*.whl",
                     ("sglang/kernels/ops/attention/fla/", "sglang/kernels/ops/attention/linear/"),
                     ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
                      "sglang.kernels.ops.attention.fla", "sglang.kernels.ops.attention.linear")),
}


def _engine(name):
    if name not in WHEELS:
        raise ValueError(f"engine: {name!r} not one of {tuple(WHEELS)}")
    return WHEELS[name]


def _cache_home():
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gdn2-oracle"


def peers_dir():
    """The folder of third-party packages: ``$GDN2_PEERS``, else ``$XDG_CACHE_HOME/gdn2-oracle/peers``."""
    return Path(os.environ.get(PEERS_ENV) or _cache_home() / "peers")


def find_wheel(engine):
    """The engine's wheel in ``<peers_dir>/wheels``; ValueError naming ``make peers`` and the folder if absent."""
    spec = _engine(engine)
    folder = peers_dir() / "wheels"
    found = sorted(folder.glob(spec.wheel)) if folder.is_dir() else []
    if not found:
        raise ValueError(f"engine: {engine} {spec.version}'s wheel ({spec.wheel}) is not in {folder}; {_MAKE}, or "
                         f"set {PEERS_ENV} to the folder whose wheels/ holds it")
    return found[-1]


def wheel_hash(path):
    """The SHA-256 of a wheel file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract(engine, wheel=None):
    """The folder holding the engine's kernel files from its wheel, extracted once per wheel hash."""
    spec = _engine(engine)
    wheel = Path(wheel) if wheel is not None else find_wheel(engine)
    target = _cache_home() / "engines" / f"{engine}-{wheel_hash(wheel)[:16]}"
    done = target / ".extracted"
    if done.is_file():
        return target
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(spec.folders) and n.endswith(".py")]
        if not names:
            raise ValueError(f"engine: {wheel} has none of the kernel folders {spec.folders}")
        for name in names:
            archive.extract(name, target)
    done.write_text(wheel.name + "\n")
    return target


# --- the stand-ins --------------------------------------------------------------------------------------------

class _NoPlatform:
    """vLLM's ``current_platform`` on a machine without one: every ``is_*`` query False."""

    def __getattr__(self, name):
        if name.startswith("is_"):
            return lambda *args, **kwargs: False
        raise AttributeError(name)


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _custom_op():
    torch = importlib.import_module("torch")

    class CustomOp(torch.nn.Module):
        """vLLM's ``CustomOp`` as a plain ``nn.Module`` (``register`` leaves the class as it is)."""

        @classmethod
        def register(cls, name):
            return lambda op: op

    return CustomOp


def stand_ins(engine):
    """``{module name: stand-in module}`` for the engine's imports outside its kernel files (module docstring)."""
    triton = importlib.import_module("triton")
    tl = importlib.import_module("triton.language")
    if engine == "vllm":
        tldevice = importlib.import_module("triton.language.extra.libdevice")
        return {
            "vllm.triton_utils": _module("vllm.triton_utils", triton=triton, tl=tl, tldevice=tldevice),
            "vllm.platforms": _module("vllm.platforms", current_platform=_NoPlatform()),
            "vllm.utils": _module("vllm.utils", __path__=[]),
            "vllm.utils.math_utils": _module("vllm.utils.math_utils", cdiv=lambda a, b: -(a // -b),
                                             next_power_of_2=triton.next_power_of_2, RCP_LN2=1 / math.log(2)),
            "vllm.utils.platform_utils": _module("vllm.utils.platform_utils", num_compute_units=lambda *a: 1),
            "vllm.utils.torch_utils": _module("vllm.utils.torch_utils", async_tensor_h2d=lambda x, device=None,
                                              dtype=None, **kw: x.to(device=device, dtype=dtype)),
            "vllm.utils.gpu_sync_debug": _module("vllm.utils.gpu_sync_debug",
                                                 gpu_sync_allowed=contextlib.nullcontext),
            "vllm.model_executor": _module("vllm.model_executor", __path__=[]),
            "vllm.model_executor.custom_op": _module("vllm.model_executor.custom_op", CustomOp=_custom_op()),
        }
    torch = importlib.import_module("torch")
    release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    no = lambda *args, **kwargs: False  # noqa: E731 - the stand-in's every hardware query
    common = _module("sglang.srt.utils.common", torch_release=release)
    return {
        "sglang.srt": _module("sglang.srt", __path__=[]),
        "sglang.srt.utils": _module("sglang.srt.utils", __path__=[], common=common, is_gfx95_supported=no,
                                    is_sm100_supported=no, is_hip=no, is_cuda=no, is_npu=no, is_xpu=no),
        "sglang.srt.utils.common": common,
    }


def _owned(name, engine):
    return name == engine or name.startswith(engine + ".")


@contextlib.contextmanager
def engine_modules(engine, root):
    """Inside: the engine's package modules (empty, their ``__path__`` in ``root``) and its stand-ins in
    ``sys.modules`` under the engine's names. After: every ``<engine>`` / ``<engine>.*`` entry removed, and any
    that was there before restored."""
    spec = _engine(engine)
    saved = {n: m for n, m in list(sys.modules.items()) if _owned(n, engine)}
    for name in saved:
        del sys.modules[name]
    try:
        for package in spec.packages:
            path = Path(root, *package.split("."))
            sys.modules[package] = _module(package, __path__=[str(path)], __package__=package)
        sys.modules.update(stand_ins(engine))
        yield
    finally:
        for name in [n for n in list(sys.modules) if _owned(n, engine)]:
            del sys.modules[name]
        sys.modules.update(saved)


# --- the fixes ------------------------------------------------------------------------------------------------

def interpreted_builtin(member):
    """Triton builtin ``member`` callable from an interpreted kernel under another name (an alias such as
    ``exp = tl.exp``): called with the interpreter's semantic, as the interpreter patches ``tl.*`` itself."""
    from triton.runtime.interpreter import interpreter_semantic

    def call(*args, **kwargs):
        kwargs.pop("_semantic", None)
        return member(*args, **kwargs, _semantic=interpreter_semantic)

    call.__name__ = getattr(member, "__name__", "builtin")
    call.__wrapped__ = member
    return call


def fix_loaded(modules):
    """Make the loaded engine ``modules`` runnable in the interpreter: builtin aliases callable, SGLang's device
    context a null context (module docstring)."""
    from triton.language.core import is_builtin

    for module in modules:
        for name, value in list(vars(module).items()):
            if callable(value) and not isinstance(value, type) and is_builtin(value):
                setattr(module, name, interpreted_builtin(value))
        if hasattr(module, "custom_device_ctx"):
            module.custom_device_ctx = lambda index: contextlib.nullcontext()


def _bool_mask(method, mask_at):
    """An interpreter builder method with its mask argument (position ``mask_at``) cast to bool."""
    import numpy as np

    def run(self, *args, **kwargs):
        args = list(args)
        mask = args[mask_at]
        if mask is not None and mask.data.dtype != np.bool_:
            args[mask_at] = type(mask)(mask.data.astype(np.bool_), mask.dtype)
        return method(self, *args, **kwargs)

    run.__wrapped__ = method
    return run


def _float_dot(create_dot):
    """The interpreter's ``create_dot`` with bfloat16 operands converted to float32 first (module docstring)."""
    import numpy as np
    from triton import language as tl
    from triton.runtime.interpreter import TensorHandle, _convert_float

    def as_float32(x):
        if x.dtype.scalar == tl.bfloat16:
            return TensorHandle(_convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32), tl.float32)
        return x

    def run(self, a, b, d, *args, **kwargs):
        return create_dot(self, as_float32(a), as_float32(b), d, *args, **kwargs)

    run.__wrapped__ = create_dot
    return run


def _bfloat16_in_float32(op, arity):
    """The interpreter's elementwise ``op`` (``binary_op`` / ``unary_op``) on bfloat16 operands computed on their
    float32 values and rounded back to bfloat16 (module docstring); other dtypes as they were."""
    import numpy as np
    from triton import language as tl
    from triton.runtime.interpreter import TensorHandle, _convert_float

    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        return TensorHandle(_convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32), tl.float32)

    def run(self, *args):
        handles, rest = args[:arity], args[arity:]
        if not any(h.dtype.scalar == tl.bfloat16 for h in handles):
            return op(self, *args)
        out = op(self, *(widen(h) for h in handles), *rest)
        if out.data.dtype == np.float32:
            return TensorHandle(bfloat16_bits(out.data), tl.bfloat16)
        return TensorHandle(out.data, handles[0].dtype.scalar)

    run.__wrapped__ = op
    return run


def bfloat16_bits(x):
    """The bfloat16 bit patterns (uint16) of float32 array ``x``, rounded to nearest even (NaN stays NaN)."""
    import numpy as np

    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def _rounded_cast(cast_impl):
    """The interpreter's ``cast_impl`` with float32 -> bfloat16 rounded to nearest even, as compiled Triton casts
    (the interpreter passes no rounding mode there, which truncates toward zero)."""
    from triton import language as tl
    from triton.runtime.interpreter import TensorHandle

    def run(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return TensorHandle(bfloat16_bits(src.data), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    run.__wrapped__ = cast_impl
    return run


def install_interpreter_fixes():
    """Install the bool-mask and bfloat16 fixes into Triton's interpreter builder (idempotent)."""
    from triton.runtime.interpreter import InterpreterBuilder

    for name, wrap in (("create_masked_load", lambda m: _bool_mask(m, 1)),
                       ("create_masked_store", lambda m: _bool_mask(m, 2)), ("create_dot", _float_dot),
                       ("binary_op", lambda m: _bfloat16_in_float32(m, 2)),
                       ("unary_op", lambda m: _bfloat16_in_float32(m, 1)), ("cast_impl", _rounded_cast)):
        method = getattr(InterpreterBuilder, name)
        if getattr(method, "__wrapped__", None) is None:
            setattr(InterpreterBuilder, name, wrap(method))


# --- loading ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Loaded:
    """An engine's kernel modules as loaded: ``modules[name]`` (full module names), the wheel and the folder."""

    engine: str
    wheel: Path
    root: Path
    modules: dict

    def module(self, name):
        """The loaded module ``name`` (its full name in the engine)."""
        return self.modules[name]


_LOADED = {}


def load(engine, modules, who="engine kernel"):
    """The engine's kernel ``modules`` (full names) loaded from its wheel in Triton's interpreter (module
    docstring); a module already loaded is reused."""
    wheel = find_wheel(engine)  # first: a missing wheel leaves the process as it was
    triton_interpret.enable(who)
    install_interpreter_fixes()
    key = (engine, str(wheel))
    loaded = _LOADED.get(key)
    if loaded is None:
        loaded = _LOADED[key] = Loaded(engine, wheel, extract(engine, wheel), {})
    missing = [m for m in modules if m not in loaded.modules]
    if missing:
        with engine_modules(engine, loaded.root):
            sys.modules.update(loaded.modules)
            for name in missing:
                try:
                    importlib.import_module(name)
                except Exception as exc:  # noqa: BLE001 - any import failure: say which file
                    raise ValueError(f"engine: cannot load {name} from {wheel.name} ({type(exc).__name__}: {exc})") \
                        from None
            new = {n: m for n, m in sys.modules.items() if _owned(n, engine) and n not in loaded.modules
                   and getattr(m, "__file__", None) and str(loaded.root) in m.__file__}
        fix_loaded(new.values())
        loaded.modules.update(new)
    return loaded
