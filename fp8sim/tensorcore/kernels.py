"""The kernel registry: which kernel computes an accumulator model, and why the others do not.

Two operations have kernels:

* ``"chain"`` -- the instruction chain of :func:`fp8sim.tensorcore.mma` and
  :func:`fp8sim.tensorcore.matmul` (one accumulator carried through consecutive instructions);
* ``"scaled"`` -- the promoted scaled GEMM of :func:`fp8sim.gemms.engine.scaled_matmul` (FP8 codes
  and their scales per K block in, the fp32 accumulator out: the tensor-core partial of every
  promotion interval scaled and added into fp32), which :func:`fp8sim.gemm`, :func:`fp8sim.scaled_gemm`,
  :func:`fp8sim.identify` and the device path run.

Each :class:`Kernel` says in words what it computes and, through :meth:`Kernel.supports`, either
``None`` (it computes the request bit for bit) or the reason it does not.  :data:`KERNELS` is the
one ordered list, fastest first; :func:`select` returns the first kernel that supports a
:class:`Request` and :func:`explain` every kernel of the request's operation with its reason.

Facts that depend on the data: a :class:`Request` may leave ``finite_codes`` unknown (``None``).
The packed kernel then counts as supporting the request and checks the codes while it runs; where
they hold inf / NaN codes it returns ``None`` and the caller selects again with
``finite_codes=False`` (the general wgmma kernel, which takes any codes, is then first).

The kernels themselves are run by their callers (``mma``/``matmul`` here, ``scaled_matmul`` in
:mod:`fp8sim.gemms.engine`); this module only decides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..formats import Format
from .codes import code_table
from .model import K_INSTR, AccumulatorModel

__all__ = [
    "Kernel",
    "Request",
    "NoKernelError",
    "KERNELS",
    "OPERATIONS",
    "select",
    "explain",
    "get_kernel",
    "chain_request",
    "scaled_request",
    "chain_granule",
    "cuda_available",
    "with_facts",
    "packed_operands",
    "cuda_operands",
]

#: operation name -> what it is, in words
OPERATIONS = {
    "chain": "the instruction chain of fp8sim.tensorcore.mma / matmul",
    "scaled": "the promoted scaled GEMM of scaled_matmul (fp8sim.gemm, scaled_gemm, identify, the device path)",
}


class NoKernelError(NotImplementedError, ValueError):
    """No kernel supports the request (a ``ValueError``, and a ``NotImplementedError`` as the
    CuPy backend raised before); the message lists every kernel's reason."""


@dataclass(frozen=True)
class Request:
    """What a caller asks a kernel to compute.  ``None`` means "not known": a kernel whose condition
    depends on an unknown fact counts as supporting it (``finite_codes``: the packed kernel checks
    while it runs) or does not check it (formats, K)."""

    operation: str  #: "chain" or "scaled"
    model: AccumulatorModel | None  #: None: the "fp64" accumulator (scaled only)
    a_format: Format | None = None
    b_format: Format | None = None
    k: int | None = None  #: the product's K (chain: the whole K; scaled: the padded K)
    m: int | None = None
    n: int | None = None
    block_scales: bool = False  #: chain: block scales folded into every instruction
    out16: bool = False  #: chain: D held in fp16 (out_format="f16")
    fidelity: str = "exact"  #: scaled: "exact" or "fast"
    backend: str = "cpu"  #: scaled: "cpu" or "cupy"
    finite_codes: bool | None = None  #: scaled: whether no operand code is inf / NaN

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {list(OPERATIONS)}, got {self.operation!r}")

    def describe(self) -> str:
        name = "'fp64'" if self.model is None else repr(self.model.name)
        fmts = ""
        if self.a_format is not None and self.b_format is not None:
            fmts = f" on {self.a_format.name} x {self.b_format.name}"
        return f"{self.operation} with model {name}{fmts}"


def chain_request(model, a_format=None, b_format=None, k=None, *, block_scales=False, out16=False) -> Request:
    """A :class:`Request` for the instruction chain (:func:`~fp8sim.tensorcore.matmul`)."""
    return Request("chain", model, a_format, b_format, k, block_scales=block_scales, out16=out16)


def scaled_request(
    model, a_format=None, b_format=None, *, m=None, n=None, k=None, fidelity="exact", backend="cpu", finite_codes=None
) -> Request:
    """A :class:`Request` for the promoted scaled GEMM (``scaled_matmul``)."""
    return Request(
        "scaled", model, a_format, b_format, k, m, n, fidelity=fidelity, backend=backend, finite_codes=finite_codes
    )


@dataclass(frozen=True)
class Kernel:
    """One kernel: its ``name``, what it ``computes`` in words, the ``operation`` it serves, its
    ``device`` ("cpu" or "cuda") and the ``where`` it lives; :meth:`claims` the model-only
    condition, :meth:`supports` the whole one."""

    name: str
    computes: str
    operation: str
    device: str
    where: str
    _claims: Callable[[AccumulatorModel | None], str | None] = field(repr=False, compare=False)
    _supports: Callable[[Request], str | None] = field(repr=False, compare=False)
    _defers: Callable[[Request], str | None] | None = field(default=None, repr=False, compare=False)

    def claims(self, model: AccumulatorModel | None) -> str | None:
        """None where the kernel computes ``model`` (for some operands), else why not."""
        return self._claims(model)

    def can_compute(self, request: Request) -> str | None:
        """None where the kernel computes ``request`` bit for bit (though it may give way to a later
        kernel, see :meth:`supports`), else the reason it cannot."""
        if request.operation != self.operation:
            return f"serves {OPERATIONS[self.operation]}, not {request.operation!r}"
        why = self._claims(request.model)
        return why if why is not None else self._supports(request)

    def supports(self, request: Request) -> str | None:
        """None where :func:`select` may take this kernel for ``request``: it computes the request
        (:meth:`can_compute`) and does not give way to a later kernel; else the reason."""
        why = self.can_compute(request)
        if why is None and self._defers is not None:
            why = self._defers(request)
        return why


# ---------------------------------------------------------------- the conditions (private bodies)
def _sm90_claims(model):
    """The models the sm90 bit-level kernel (:mod:`~fp8sim.tensorcore._bitexact`) computes."""
    if model is None:
        return "needs an accumulator model (not 'fp64')"
    if model.kind not in ("fused", "exact", "fp32"):
        return f"kind {model.kind!r} (only 'fused', 'exact', 'fp32')"
    if model.instr_k != K_INSTR:
        return f"instr_k={model.instr_k} (only {K_INSTR})"
    if model.zero_exponent is not None:
        return f"zero_exponent={model.zero_exponent} (only None)"
    if model.group != 1:
        return f"group={model.group} (only 1)"
    if model.overflow != "ieee":
        return f"overflow={model.overflow!r} (only 'ieee')"
    return None


def _sm90_supports(r: Request):
    if r.block_scales:
        return "block scales (only without)"
    if r.out16:
        return "out_format='f16' (only 'f32')"
    for n, f in (("a", r.a_format), ("b", r.b_format)):
        if f is not None and (f.bits != 8 or not f.fits_float32):
            return f"operand {f.name} ({n}): not an 8-bit format"
    if r.k is not None and r.k % K_INSTR != 0:
        return f"K = {r.k} is not a multiple of {K_INSTR}"
    return None


def _sm90_defers(r: Request):
    model = r.model
    assert model is not None
    if model.kind == "fused" and not model.validated and _general_claims(model) is None:
        return (
            "a 'fused' model not validated on hardware: the general kernels run it "
            "(this kernel runs the H200-validated presets and the models only it computes)"
        )
    return None


def _general_claims(model):
    """The models the kernels of :mod:`~fp8sim.tensorcore.scaled_mma` compute."""
    if model is None:
        return "needs an accumulator model (not 'fp64')"
    if model.kind == "interleaved":
        if model.output != "f32" or model.block % 2:
            return "kind='interleaved' needs output 'f32' and an even block"
        return None
    if model.kind != "fused":
        return f"kind {model.kind!r} (the kernels here compute 'fused' and 'interleaved')"
    for name, value, want in (
        ("c_mode", model.c_mode, "fused"),
        ("product_exponent", model.product_exponent, "nominal"),
        ("zero_sign", model.zero_sign, "positive"),
        ("k_order", model.k_order, None),
    ):
        if value != want:
            return f"{name}={value!r} (only {want!r})"
    if model.subnormal_exponent not in ("clamp", "normalize"):
        return f"subnormal_exponent={model.subnormal_exponent!r} (only 'clamp' or 'normalize')"
    if model.group > 1 and model.align_rounding != "rz":
        return "group > 1 needs align_rounding='rz'"
    return None


def _none(r: Request):
    return None


def _wgmma_claims(model):
    """The fused wgmma-type models the wgmma kernels (:mod:`~fp8sim.tensorcore.fast`, its CUDA twin)
    compute."""
    if model is None:
        return "needs an accumulator model (not 'fp64')"
    if (  # the common case first, without building the reasons
        model.kind == "fused"
        and model.block == 32
        and model.c_mode == "fused"
        and model.align_rounding == "rz"
        and model.product_exponent == "nominal"
        and model.subnormal_exponent == "clamp"
        and model.out_rounding == "rz"
        and model.output == "f32"
        and model.k_order is None
        and model.zero_sign == "positive"
        and model.instr_k == 32
        and model.zero_exponent is None
        and model.group == 1
        and model.overflow == "ieee"
        and model.sum_frac_bits is None
        and model.frac_bits <= 13
        and model.out_frac_bits <= 13
    ):
        return None
    for name, value, want in (
        ("kind", model.kind, "fused"),
        ("block", model.block, 32),
        ("c_mode", model.c_mode, "fused"),
        ("align_rounding", model.align_rounding, "rz"),
        ("product_exponent", model.product_exponent, "nominal"),
        ("subnormal_exponent", model.subnormal_exponent, "clamp"),
        ("out_rounding", model.out_rounding, "rz"),
        ("output", model.output, "f32"),
        ("k_order", model.k_order, None),
        ("zero_sign", model.zero_sign, "positive"),
        ("instr_k", model.instr_k, 32),
        ("zero_exponent", model.zero_exponent, None),
        ("group", model.group, 1),
        ("overflow", model.overflow, "ieee"),
        ("sum_frac_bits", model.sum_frac_bits, None),
    ):
        if value != want:
            return f"{name}={value!r} (only {want!r})"
    if model.frac_bits > 13 or model.out_frac_bits > 13:
        return f"frac_bits={model.frac_bits}, out_frac_bits={model.out_frac_bits} (at most 13)"
    return None


def _cpu_exact(r: Request):
    if r.backend != "cpu":
        return f"backend={r.backend!r} (a CPU kernel)"
    if r.fidelity != "exact":
        return f"fidelity={r.fidelity!r} (a bit-exact kernel)"
    return None


_E_MIN, _E_MAX = -17, 15  # the nominal exponents the packed kernel's int8 / bias ranges hold for


@functools.lru_cache(maxsize=128)
def packed_operands(fa: Format, fb: Format, F: int) -> str | None:
    """None where the packed kernel covers the format pair with ``F`` kept fraction bits: nominal
    exponents in [-17, 15] (every exponent sum, the zero codes' placeholder and the accumulator's
    exponent then fit the kernel's int8 and bias ranges), ``F <= 13``, and significands short enough
    for A's nudge ``1 + 2**-(23 - mbits_a)`` (``2 * mbits_a + mbits_b <= 21``); else the reason.  Part
    of the ``"packed"`` kernel's :meth:`Kernel.supports`, and checked by the kernel itself
    (:func:`fp8sim.tensorcore.fast.wgmma_gemm_codes`) when it is called directly."""
    for name, f in (("a", fa), ("b", fb)):
        if f.bits != 8:
            return f"operand {f.name} ({name}): not an 8-bit format"
        t = code_table(f, "clamp")
        e = t.exp[t.cls == 1]
        if e.size and (e.min() < _E_MIN or e.max() > _E_MAX):
            return f"operand {f.name}: nominal exponent outside [{_E_MIN}, {_E_MAX}]"
    if not 0 <= F <= 13:
        return f"F = {F} kept fraction bits (0 to 13)"
    if 2 * fa.mbits + fb.mbits > 21:
        return f"{fa.name} x {fb.name}: 2 * mbits_a + mbits_b = {2 * fa.mbits + fb.mbits} > 21 (A's nudge inexact)"
    return None


def _packed_supports(r: Request):
    why = _cpu_exact(r)
    if why is not None:
        return why
    if r.a_format is not None and r.b_format is not None:
        assert r.model is not None
        why = packed_operands(r.a_format, r.b_format, int(r.model.frac_bits))
        if why is not None:
            return why
    if 0 in (r.m, r.n, r.k):
        return "an empty product (M, N or K is 0)"
    if r.k is not None and r.k >= 2**40:
        return "K >= 2**40 (the accumulator's exponent bound)"
    if r.finite_codes is False:
        return "the operands hold inf / NaN codes (finite codes only)"
    return None


def cuda_operands(fa: Format, fb: Format, F: int, out_frac_bits: int) -> str | None:
    """None where the CUDA kernel's truncation identity holds (see :mod:`._cuda_source`): F <= 18, A's values times
    ``1 + 2**-20`` exact in float32 (at most 3 fraction bits), at most 18 fraction bits in a
    product, and C (the accumulator, ``out_frac_bits`` fraction bits) of at most 19; else the reason.
    Part of the ``"cuda"`` kernel's :meth:`Kernel.supports`, and checked by
    :func:`fp8sim.tensorcore.cuda.device_wgmma_gemm` itself."""
    if F <= 18 and fa.mbits <= 3 and fa.mbits + fb.mbits <= 18 and out_frac_bits <= 19:
        return None
    return (
        f"{fa.name} x {fb.name} with F={F}, out_frac_bits={out_frac_bits}: outside the kernel's exactness "
        "conditions (F <= 18, mbits_a <= 3, mbits_a + mbits_b <= 18, out_frac_bits <= 19)"
    )


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """Whether CuPy imports and sees a CUDA device (checked once)."""
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device
        return False


def _cuda_supports(r: Request):
    if r.backend != "cupy":
        return f"backend={r.backend!r} (this kernel is backend='cupy')"
    if r.fidelity != "exact":
        return f"fidelity={r.fidelity!r} (a bit-exact kernel)"
    if r.a_format is not None and r.b_format is not None:
        assert r.model is not None
        why = cuda_operands(r.a_format, r.b_format, int(r.model.frac_bits), int(r.model.out_frac_bits))
        if why is not None:
            return why
    if not cuda_available():
        return "needs CuPy and a CUDA device"
    return None


def _any_model(model):
    return None


def _fast_supports(r: Request):
    if r.backend != "cpu":
        return f"backend={r.backend!r} (a CPU kernel)"
    if r.fidelity != "fast":
        return f"fidelity={r.fidelity!r} (this is fidelity='fast', not bit-exact)"
    return None


def _fp64_claims(model):
    return None if model is None else f"model {model.name!r} (this kernel is the 'fp64' accumulator)"


def _loop_claims(model):
    return "the 'fp64' accumulator has no instruction chain" if model is None else None


def _loop_supports(r: Request):
    why = _cpu_exact(r)
    if why is not None:
        return why
    chain = chain_request(r.model, r.a_format, r.b_format)
    if any(k.operation == "chain" and k.supports(chain) is None for k in KERNELS):
        return None
    return "no chain kernel computes it: " + "; ".join(f"{k.name}: {w}" for k, w in explain(chain))


KERNELS: tuple[Kernel, ...] = (
    Kernel(
        "cuda",
        "the CUDA-core twin of the wgmma kernel, launched through CuPy (the fused wgmma-type models)",
        "scaled",
        "cuda",
        "fp8sim.tensorcore.cuda.device_wgmma_gemm",
        _wgmma_claims,
        _cuda_supports,
    ),
    Kernel(
        "blas-fast",
        "fidelity='fast': each promotion interval as a float32 BLAS product of the decoded values (not bit-exact)",
        "scaled",
        "cpu",
        "numpy.matmul",
        _any_model,
        _fast_supports,
    ),
    Kernel(
        "fp64",
        "the 'fp64' accumulator: each promotion interval as a float64 BLAS product, rounded once to fp32",
        "scaled",
        "cpu",
        "numpy.matmul",
        _fp64_claims,
        _cpu_exact,
    ),
    Kernel(
        "packed",
        "the packed wgmma kernel on finite codes: tiles decoded through code tables, one LLVM tile "
        "function per 32-product group (the fused wgmma-type models)",
        "scaled",
        "cpu",
        "fp8sim.tensorcore.fast.wgmma_gemm_codes",
        _wgmma_claims,
        _packed_supports,
    ),
    Kernel(
        "wgmma",
        "the general wgmma kernel on decoded values, inf / NaN codes included (the fused wgmma-type models)",
        "scaled",
        "cpu",
        "fp8sim.tensorcore.fast.wgmma_gemm",
        _wgmma_claims,
        _cpu_exact,
    ),
    Kernel(
        "sm90-bitlevel",
        "the sm90 bit-level kernel: 'fused', 'exact' and 'fp32' models on whole K = 32 instructions "
        "of 8-bit operands, batched (the H200-validated reference)",
        "chain",
        "cpu",
        "fp8sim.tensorcore._bitexact.matmul_kernel",
        _sm90_claims,
        _sm90_supports,
        _sm90_defers,
    ),
    Kernel(
        "general",
        "the general instruction-chain kernels: any operand format, block scales, FP4 groups, "
        "'interleaved' (CDNA3), fp16 outputs",
        "chain",
        "cpu",
        "fp8sim.tensorcore.scaled_mma.run_general",
        _general_claims,
        _none,
    ),
    Kernel(
        "chain-loop",
        "one fp8sim.tensorcore.matmul (the instruction chain) per promotion interval, promoted in fp32 "
        "(any accumulator model; the bit-exact reference of the scaled GEMM)",
        "scaled",
        "cpu",
        "fp8sim.gemms.engine.scaled_matmul",
        _loop_claims,
        _loop_supports,
    ),
)

_BY_NAME = {k.name: k for k in KERNELS}


def get_kernel(name: str) -> Kernel:
    """The kernel of :data:`KERNELS` called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(_BY_NAME)}") from None


def explain(request: Request) -> list[tuple[Kernel, str | None]]:
    """Every kernel of the request's operation, in :data:`KERNELS` order, with ``None`` where it
    supports the request and the reason where it does not."""
    return [(k, k.supports(request)) for k in KERNELS if k.operation == request.operation]


def select(request: Request, kernel: str | None = None) -> Kernel:
    """The first kernel of :data:`KERNELS` that supports ``request``; :class:`NoKernelError` (a
    ``ValueError``) listing every kernel's reason where none does.

    With ``kernel`` (a name): that kernel, where it can compute the request (:meth:`Kernel.can_compute`,
    for tests and benchmarks that run one kernel against another), else :class:`NoKernelError`."""
    if kernel is not None:
        k = get_kernel(kernel)
        why = k.can_compute(request)
        if why is not None:
            raise NoKernelError(f"kernel {kernel!r} does not compute the {request.describe()}: {why}")
        return k
    for k in KERNELS:
        if k.operation == request.operation and k.supports(request) is None:
            return k
    lines = "; ".join(f"{k.name}: {why}" for k, why in explain(request))
    raise NoKernelError(f"no kernel computes the {request.describe()}: {lines}")


def chain_granule(model: AccumulatorModel) -> int:
    """The K granule :func:`~fp8sim.tensorcore.matmul` takes for ``model``: the model's block where
    the general kernels compute it (or no kernel does), else the sm90 kernel's instruction (32)."""
    if _general_claims(model) is None or _sm90_claims(model) is not None:
        return model.block
    return K_INSTR


def with_facts(request: Request, **facts) -> Request:
    """``request`` with facts learnt while running (``finite_codes=False``)."""
    return replace(request, **facts)
