"""``fp8sim.torch.linear``: ``y = x @ weight.T + bias`` as an autograd function whose three GEMMs run
through an fp8sim recipe.

For ``x (T, K)`` (T tokens; leading dimensions are flattened) and a torch weight ``(N, K)``:

==========  ====================  =====  ==========================================================
GEMM        product               K      how it runs (:func:`fp8sim.training.matmul`, role)
==========  ====================  =====  ==========================================================
Fprop       ``y  = x @ W^T``      K      ``matmul(x, weight, recipe, "fprop", layout="nk")``
Dgrad       ``dx = dy @ W``       N      ``matmul(dy, weight, recipe, "dgrad")``
Wgrad       ``dW = dy^T @ x``     T      ``matmul(x^T, dy, recipe, "wgrad")``, transposed to (N, K)
==========  ====================  =====  ==========================================================

These are the GEMMs of :class:`fp8sim.training.Linear` (whose master weight is ``weight.T``), with
the same operands quantized along the same axes: activations ``x_format`` in ``x_granularity``
along K (DeepSeek-V3's 1x128 tiles), the weight ``w_format`` in ``w_granularity`` (128x128), the
gradient ``grad_format`` when the recipe has one (E5M2 for ``te-hybrid``) and ``x_format``
otherwise; Dgrad and Wgrad run :meth:`fp8sim.Recipe.backward`; Wgrad re-quantizes ``x^T`` and
``dy`` along the tokens and writes FP32.  The output and both gradients are therefore
bit-identical to fp8sim's numpy API on the same values.

Values and dtypes: float32, bfloat16 and float64 tensors (bfloat16 converted to float32 exactly;
float16 is refused: the FP8 presets write BF16 values, and float16 does not hold them all -- its
range ends at 65504 and below 2**-14 it loses bits).  ``x`` and ``weight`` may have different dtypes (e.g.
FP32 master weights and BF16 activations).  The output and ``grad_x`` are converted to ``x``'s
dtype, ``grad_weight`` to the weight's and ``grad_bias`` to the bias's (torch's round to nearest
even: exact for BF16 values, one rounding of the FP32 weight gradient for a bfloat16 weight).

Bias: added to the GEMM's fp32 result before the output cast, ``y = round(fp32(acc + fp32(bias)))``,
the order of cuBLASLt's bias epilogue (the bias converted to fp32 first).  ``grad_bias`` is the sum
of ``dy`` over the tokens in float64, rounded once to the bias's dtype.

Devices: CPU tensors go to the numba kernels as numpy views (only bfloat16 tensors and
non-contiguous operands are copied, as the kernels need); CUDA tensors go through
:func:`_device_gemm`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from .._fpenv import ieee_defaults
from ..gemms.engine import cast_output
from ..gemms.presets import recipe as get_recipe
from ..gemms.recipes import Recipe
from ..scaling import granularity as as_granularity
from ..scaling import quantize
from ..training.linear import matmul, quantize_operand
from .stateful import LayerState, host_backward, host_forward, is_stateful

__all__ = [
    "linear",
    "LinearFunction",
    "LinearOptions",
    "ActivationCache",
    "SUPPORTED_DTYPES",
    "LayerState",
    "options",
    "group_recipe",
    "expand_groups",
]

#: the torch dtypes :func:`linear` takes
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
_DEVICES = ("cpu", "cuda")
_MMA_K = 32  # K of one FP8 MMA instruction


# ------------------------------------------------------------------ options
@dataclass(frozen=True)
class ActivationCache:
    """The number format in which a Linear layer keeps its input ``x`` for the Wgrad GEMM.

    ``x`` is quantized to ``format`` with ``granularity`` along its channels (the Fprop GEMM's K)
    and the scale format ``scale_format`` (None: the granularity's default, fp32 for tiles), and
    Wgrad reads the dequantized values (re-quantizing them along the tokens as it always does).
    DeepSeek-V3 keeps the input of the post-attention Linear as ``ActivationCache("e5m6", "1x128",
    "pow2")``.  ``format`` may be any format of :func:`fp8sim.format` (12-bit E5M6 included: this
    is a storage format, not a GEMM operand).  The emulation stores the dequantized float32 values,
    the numbers Wgrad reads; it does not save memory by caching.
    """

    format: str = "e4m3"
    granularity: str = "1x128"
    scale_format: str | None = None

    def values(self, x: np.ndarray) -> np.ndarray:
        """``x`` (2-D, channels along axis 1) as this cache holds it: quantized, then dequantized
        to float32."""
        q = quantize(x, self.format, self.granularity, scale_format=self.scale_format)
        return q.dequantize(np.float32)


@dataclass(frozen=True)
class LinearOptions:
    """What :func:`linear` runs: the :class:`~fp8sim.Recipe`, the GEMM ``fidelity`` (as
    :func:`fp8sim.gemm`), the activation cache for Wgrad (``None``: ``x`` as given, as
    :class:`fp8sim.training.Linear` keeps it; ``"fprop"``: the Fprop GEMM's own quantization of
    ``x``; or an :class:`ActivationCache`) and ``group_size`` (None, or per-group scaling of that
    many consecutive elements along every GEMM's K: :func:`group_recipe`).  Made by
    :func:`options`, which checks them."""

    recipe: Recipe
    fidelity: str = "exact"
    cache: str | ActivationCache | None = None
    group_size: int | None = None
    _key: int = field(default=-1, init=False, repr=False, compare=False)
    _stateful: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the operators of torch.compile take the options as this process-local number (_OPTIONS)
        object.__setattr__(self, "_key", _register(self))
        object.__setattr__(self, "_stateful", is_stateful(self.recipe))

    def __reduce__(self):  # pickled and copied by value: the copy registers itself again
        return (type(self), (self.recipe, self.fidelity, self.cache, self.group_size))

    @property
    def caches(self) -> bool:
        """True when Wgrad reads other values than ``x`` itself (``"fprop"`` with a wide recipe,
        whose GEMMs round ``x`` to their own format anyway, keeps ``x``)."""
        return isinstance(self.cache, ActivationCache) or (self.cache == "fprop" and self.recipe.is_fp8)

    @cached_property
    def gemm_recipe(self) -> Recipe:
        """The recipe the GEMMs run: :attr:`recipe`, or its per-group variant (:func:`group_recipe`)."""
        if self.group_size is None or not self.recipe.is_fp8:
            return self.recipe
        return group_recipe(self.recipe, self.group_size)


_OPTIONS: list[LinearOptions] = []  # key -> options (the custom operators' ``int options`` argument)
_KEYS: dict[LinearOptions, int] = {}
_LOCK = threading.Lock()


def _register(o: LinearOptions) -> int:
    """The key of ``o`` in :data:`_OPTIONS` (equal options share one)."""
    with _LOCK:
        try:
            k = _KEYS.get(o)
        except TypeError:  # unhashable fields (a custom recipe's): compare with the registered ones
            k = next((i for i, r in enumerate(_OPTIONS) if r == o), None)
        if k is None:
            k = len(_OPTIONS)
            _OPTIONS.append(o)
            try:
                _KEYS[o] = k
            except TypeError:
                pass
        return k


def options(recipe="deepseek-v3", *, fidelity: str = "exact", cache=None, group_size=None) -> LinearOptions:
    """Checked :class:`LinearOptions` (ValueError / TypeError naming the problem)."""
    r = get_recipe(recipe)
    if fidelity not in ("exact", "fast"):
        raise ValueError(f"fp8sim.torch: fidelity must be 'exact' or 'fast', got {fidelity!r}")
    if cache is not None and cache != "fprop" and not isinstance(cache, ActivationCache):
        raise TypeError(f"fp8sim.torch: cache must be None, 'fprop' or an ActivationCache, got {cache!r}")
    if isinstance(cache, ActivationCache):  # a cache that cannot quantize fails here, not in training
        cache.values(np.zeros((1, 1), np.float32))
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
            raise TypeError(f"fp8sim.torch: group_size must be None or an int, got {group_size!r}")
        group_size = int(group_size)
        if r.is_fp8 and is_stateful(r):
            raise ValueError(
                f"fp8sim.torch: recipe {r.name!r} has stateful or random quantization (delayed scaling, "
                "stochastic rounding, 2-D weight blocks or a Hadamard transform); group_size replaces its "
                "granularities and cannot be combined with it"
            )
        if r.is_fp8:
            group_recipe(r, group_size)  # raises for a size the GEMM cannot run
    return LinearOptions(r, fidelity, cache, group_size)


# ------------------------------------------------------------------ per-group scaling
def group_recipe(recipe, size: int) -> Recipe:
    """The recipe of per-group scaling: ``size`` consecutive elements along K share a scale, on
    both operands of every GEMM.

    A multiple of 32 (one MMA instruction's K) is a recipe granularity: ``g{size}`` on both
    operands, promoted (with the scales applied) every ``promote_every`` when that divides ``size``,
    else every ``size``.  A divisor of 32 (16, 8) cannot be one: the tensor-core model multiplies
    k=32 instructions.  It is emulated on the Hopper datapath as ``mxfp8`` emulates MX blocks: every
    group of ``size`` gets its own k=32 instruction, whose other ``32 - size`` codes are zero, and
    its own scaled promotion (:func:`expand_groups` spreads the operands; the recipe returned here
    is the ``g32`` one that runs them).  Zero codes do not change the instruction's sum, and a
    group's scale depends only on its own amax, so this is per-group scaling of ``size`` with
    promotion after every group.  It is not a model of a block-scaled MMA (Blackwell's scale
    vectors of 16), which fp8sim does not model.
    """
    r = get_recipe(recipe)
    if not r.is_fp8:
        raise ValueError(f"group_recipe: recipe {r.name!r} is not an FP8 recipe")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"group_recipe: size must be a positive int, got {size!r}")
    size = int(size)
    if size % _MMA_K and _MMA_K % size:
        raise ValueError(
            f"group_recipe: groups of {size} along K: the tensor-core model runs k={_MMA_K} MMA instructions, "
            f"so a group size must be a multiple of {_MMA_K} or divide it (16, 8, ...)"
        )
    gk = max(size, _MMA_K)
    g = as_granularity(r.x_granularity).grouped(gk)

    def every(p):  # the recipe's promotion interval where it divides a group, else one group
        return p if p is not None and gk % p == 0 else gk

    return r.with_(
        name=f"{r.name}:g{size}",
        x_granularity=g,
        w_granularity=g,
        promote_every=every(r.promote_every),
        scale_at="promotion",
        backward_promote_every=every(r.backward_promote_every) if r.grad_format is not None else None,
        split_k=1,
    )


def expand_groups(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``a`` (2-D) with every group of ``size`` consecutive elements along ``axis`` moved to the start
    of its own slot of 32 elements, the rest of the slot zero (the ragged last group zero-padded):
    the operand layout of :func:`group_recipe` for sizes below 32.  Sizes of 32 and more are
    returned as they are."""
    if size >= _MMA_K:
        return a
    a = np.asarray(a)
    at = np.moveaxis(a, axis, -1)
    K = at.shape[-1]
    G = -(-K // size)
    out = np.zeros(at.shape[:-1] + (G, _MMA_K), a.dtype)
    full = K // size
    if full:
        out[..., :full, :size] = at[..., : full * size].reshape(at.shape[:-1] + (full, size))
    if K % size:
        out[..., full, : K % size] = at[..., full * size :]
    out = out.reshape(at.shape[:-1] + (G * _MMA_K,))
    return np.ascontiguousarray(np.moveaxis(out, -1, axis))


# ------------------------------------------------------------------ the GEMMs on the host
def _numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as numpy: a view for float32 / float64, float32 values for bfloat16."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def _host_gemm(a: np.ndarray, b: np.ndarray, opts: LinearOptions, role: str, layout: str, bias=None) -> np.ndarray:
    """One GEMM of ``role`` on host arrays: :func:`fp8sim.training.matmul` (``a (M, K)``, ``b``
    ``(K, N)`` or ``(N, K)`` with ``layout="nk"``), the bias (fp32 values, or None) added before the
    output cast."""
    r = opts.gemm_recipe
    if r.is_fp8 and opts.group_size is not None and opts.group_size < _MMA_K:
        a = expand_groups(a, 1, opts.group_size)
        b = expand_groups(b, 0 if layout == "kn" else 1, opts.group_size)
    elif not r.is_fp8 and a.dtype != b.dtype:  # as fp8sim.training.Linear: one dtype for both operands
        dt = np.result_type(a.dtype, b.dtype)
        a, b = a.astype(dt), b.astype(dt)
    if bias is None:
        return np.asarray(matmul(a, b, r, role, layout=layout, fidelity=opts.fidelity))
    if r.output_format == "fp64":
        return np.asarray(matmul(a, b, r, role, layout=layout, fidelity=opts.fidelity)) + bias.astype(np.float64)
    acc = np.asarray(matmul(a, b, r.with_(output_format="fp32"), role, layout=layout, fidelity=opts.fidelity))
    with np.errstate(all="ignore"):
        return cast_output(acc.astype(np.float32) + bias.astype(np.float32), r.output_format)


def _host_cache(x: np.ndarray, opts: LinearOptions) -> np.ndarray:
    """The values of ``x (T, K)`` that Wgrad reads under ``opts.cache``."""
    c = opts.cache
    if not opts.caches:
        return x
    if isinstance(c, ActivationCache):
        return c.values(x)
    r = opts.recipe
    g = r.x_granularity  # the Fprop GEMM's quantization of x (per group with group_size)
    if opts.group_size is not None:
        g = as_granularity(g).grouped(opts.group_size)
    fmt: Any = r.x_format  # a format name or an fp8sim.Format
    q = quantize_operand(x, fmt, g, 1, scale_format=r.scale_format, scale_rounding=r.scale_rounding, margin=r.margin)
    return q.dequantize(np.float32)


def _cupy():
    """CuPy, or None where it is missing or sees no GPU (then CUDA tensors take the host path)."""
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # noqa: BLE001 - no CuPy, no driver: the host path computes the same bits
        return None


def _on_gpu(opts: LinearOptions) -> bool:
    """Whether a CUDA GEMM of ``opts`` runs on the GPU (:mod:`fp8sim.gemms.device`): FP8 recipes with fp32
    block scales, without per-group expansion, whose every role's GEMM the kernel registry gives a CUDA
    kernel (:func:`fp8sim.gemms.kernel_choice` with ``backend="cupy"``); the wide recipes' fixed-order
    float64 sums and the rest run on the host, the same bits."""
    from ..formats import format as get_format
    from ..gemms.device import unsupported_reason
    from ..gemms.kernels import kernel_choice
    from ..gemms.roles import role_formats, role_granularities
    from ..tensorcore.kernels import get_kernel

    r = opts.gemm_recipe
    if not r.is_fp8 or r.block_scaled or is_stateful(r) or opts.fidelity != "exact" or _cupy() is None:
        return False
    if opts.group_size is not None and opts.group_size < _MMA_K:
        return False
    for role in ("fprop", "dgrad", "wgrad"):
        fa, fb = (get_format(f) for f in role_formats(r, role))
        rr = r.backward() if role != "fprop" else r
        if unsupported_reason(rr, fa, fb, *role_granularities(r, role)) is not None:
            return False
        # the kernel registry decides whether the role's GEMM has a CUDA kernel (not a list kept here)
        choice = kernel_choice(rr, backend="cupy", fidelity=opts.fidelity, a_format=fa, b_format=fb)
        if choice.kernel is None or get_kernel(choice.kernel).device != "cuda":
            return False
    return True


def _device_gemm(
    a: torch.Tensor, b: torch.Tensor, opts: LinearOptions, role: str, layout: str, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """One GEMM of ``role`` on CUDA tensors, the result (float32, float64 for fp64 recipes) on ``a``'s
    device.  FP8 recipes with fp32 block scales run on the GPU through CuPy (DLPack, no copy):
    :func:`fp8sim.gemms.device.gemm_device` with the role's formats and granularities, the bias added to
    the fp32 result before :func:`fp8sim.gemms.device.cast_output_device`.  Other recipes (and machines
    without CuPy) copy the operands to the host and run :func:`_host_gemm`, the same bits."""
    if not _on_gpu(opts):
        bn = None if bias is None else _numpy(bias.cpu())
        y = _host_gemm(_numpy(a.cpu()), _numpy(b.cpu()), opts, role, layout, bn)
        return torch.from_numpy(np.ascontiguousarray(y)).to(a.device)
    cp = _cupy()
    from ..gemms.device import as_cupy, cast_output_device, gemm_device
    from ..gemms.roles import role_formats, role_granularities, role_recipe

    r = opts.gemm_recipe
    with cp.cuda.Device(a.device.index):
        rr = role_recipe(r if bias is None else r.with_(output_format="fp32"), role)
        y = gemm_device(a, b, rr, layout, formats=role_formats(r, role), granularities=role_granularities(r, role))
        if bias is not None:
            y = cast_output_device(y + as_cupy(bias).astype(cp.float32), r.output_format)
        return torch.from_dlpack(y)


def _device_cache(x: torch.Tensor, opts: LinearOptions) -> torch.Tensor:
    """:func:`_host_cache` for a CUDA tensor: on the GPU for the recipe's own FP8 quantization of x
    (:func:`fp8sim.gemms.device.quantize_device`, then :func:`fp8sim.gemms.device.dequantize_device`), else on
    the host (copied there and back; the same values)."""
    c = opts.cache
    if not opts.caches:
        return x
    if isinstance(c, ActivationCache) or opts.group_size is not None or not _on_gpu(opts):
        return torch.from_numpy(np.ascontiguousarray(_host_cache(_numpy(x.cpu()), opts))).to(x.device)
    cp = _cupy()
    from ..formats import format as get_format
    from ..gemms.device import as_float32, dequantize_device, quantize_device
    from ..scaling.orientation import along_k

    r = opts.recipe
    with cp.cuda.Device(x.device.index):
        xc = as_float32(x, "x")
        fmt = get_format(r.x_format)
        block = along_k(r.x_granularity, "x").block_shape(tuple(xc.shape))
        codes, scales = quantize_device(xc, fmt, block, margin=r.margin)
        return torch.from_dlpack(dequantize_device(codes, scales, fmt, block))


def _gemm(a, b: torch.Tensor, opts: LinearOptions, role: str, layout: str, bias=None) -> torch.Tensor:
    """One GEMM: CUDA tensors through :func:`_device_gemm`, CPU tensors and numpy arrays on the host."""
    if isinstance(a, torch.Tensor) and a.is_cuda:
        return _device_gemm(a, b, opts, role, layout, bias)
    bn = None if bias is None else _numpy(bias)
    an = a if isinstance(a, np.ndarray) else _numpy(a)
    return torch.from_numpy(_host_gemm(an, _numpy(b), opts, role, layout, bn))


# ------------------------------------------------------------------ the GEMMs of one call
@ieee_defaults
def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, opts: LinearOptions):
    """Fprop of ``x (T, K)``: ``(y, saved)``, ``y (T, N)`` of ``x``'s dtype and ``saved`` the values that
    Wgrad reads in place of ``x`` (float32 ``(T, K)`` when ``opts`` caches, else an empty tensor)."""
    T, K = x.shape
    N = weight.shape[0]
    if T == 0:
        y = x.new_zeros((0, N))
    else:
        y = _gemm(x, weight, opts, "fprop", "nk", bias).to(x.dtype).contiguous()
    if not opts.caches:
        return y, x.new_empty((0,))
    if T == 0:
        return y, x.new_zeros((0, K), dtype=torch.float32)
    c = _device_cache(x, opts) if x.is_cuda else torch.from_numpy(np.ascontiguousarray(_host_cache(_numpy(x), opts)))
    return y, c.to(torch.float32).contiguous()


@ieee_defaults
def _backward(
    gy: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    opts: LinearOptions,
    x_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    need_x: bool,
    need_w: bool,
    need_b: bool,
):
    """Dgrad, Wgrad and the bias gradient of ``gy (T, N)``: ``(dx, dw, db)``; ``xs`` is what Wgrad reads
    as ``x`` (``x`` or the cached values).  A gradient not asked for is an empty tensor."""
    T = gy.shape[0]
    N, K = weight.shape
    dev = gy.device
    dx = torch.empty((0,), dtype=x_dtype, device=dev)
    dw = torch.empty((0,), dtype=weight.dtype, device=dev)
    db = torch.empty((0,), dtype=bias_dtype or torch.float32, device=dev)
    if need_x:  # Dgrad: dx = dy @ W, K = N
        if T == 0:
            dx = torch.zeros((0, K), dtype=x_dtype, device=dev)
        else:
            dx = _gemm(gy, weight, opts, "dgrad", "kn").to(x_dtype).contiguous()
    if need_w:  # Wgrad: dW^T = x^T @ dy, K = T (tokens), re-quantized along the tokens
        if T == 0:
            dw = torch.zeros((N, K), dtype=weight.dtype, device=dev)
        else:
            xt = xs.t() if xs.is_cuda else np.ascontiguousarray(_numpy(xs).T)
            dw = _gemm(xt, gy, opts, "wgrad", "kn").t().contiguous().to(weight.dtype)
    if need_b:  # the float64 sum over the tokens, rounded once
        if T == 0:
            db = torch.zeros((N,), dtype=bias_dtype, device=dev)
        else:
            db = torch.from_numpy(_numpy(gy.cpu()).astype(np.float64).sum(axis=0)).to(device=dev, dtype=bias_dtype)
    return dx, dw, db


# ------------------------------------------------------------------ custom operators (torch.compile)
# The GEMMs run numba kernels on numpy views (or CuPy on the GPU), which torch.compile cannot trace:
# they are two operators that it treats as opaque (their fake implementations give the shapes and
# dtypes), with the autograd formula of fp8sim::linear registered on it.  ``options`` is the
# LinearOptions' key in _OPTIONS (a process-local number: compiled graphs are not portable).
@torch.library.custom_op(
    "fp8sim::linear",
    mutates_args=(),
    schema="(Tensor x, Tensor weight, Tensor? bias, int options) -> (Tensor, Tensor)",
)
def _linear_op(x, weight, bias, options):
    return _forward(x, weight, bias, _OPTIONS[options])


@_linear_op.register_fake
def _linear_fake(x, weight, bias, options):
    T, K = x.shape
    saved = x.new_empty((T, K), dtype=torch.float32) if _OPTIONS[options].caches else x.new_empty((0,))
    return x.new_empty((T, weight.shape[0])), saved


@torch.library.custom_op(
    "fp8sim::linear_backward",
    mutates_args=(),
    schema="(Tensor grad, Tensor x, Tensor weight, int options, ScalarType x_dtype, ScalarType? bias_dtype, "
    "bool need_x, bool need_weight, bool need_bias) -> (Tensor, Tensor, Tensor)",
)
def _linear_backward_op(grad, x, weight, options, x_dtype, bias_dtype, need_x, need_weight, need_bias):
    return _backward(grad, x, weight, _OPTIONS[options], x_dtype, bias_dtype, need_x, need_weight, need_bias)


@_linear_backward_op.register_fake
def _linear_backward_fake(grad, x, weight, options, x_dtype, bias_dtype, need_x, need_weight, need_bias):
    T = grad.shape[0]
    N, K = weight.shape
    dx = grad.new_empty((T, K) if need_x else (0,), dtype=x_dtype)
    dw = grad.new_empty((N, K) if need_weight else (0,), dtype=weight.dtype)
    db = grad.new_empty((N,) if need_bias else (0,), dtype=bias_dtype or torch.float32)
    return dx, dw, db


def _linear_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, key = inputs
    ctx.key, ctx.x_dtype, ctx.bias_dtype = key, x.dtype, (None if bias is None else bias.dtype)
    ctx.save_for_backward(output[1] if _OPTIONS[key].caches else x, weight)


def _linear_autograd(ctx, gy, _grad_saved):
    xs, weight = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx, dw, db = torch.ops.fp8sim.linear_backward(
        gy, xs, weight, ctx.key, ctx.x_dtype, ctx.bias_dtype, need_x, need_w, need_b
    )
    return (dx if need_x else None), (dw if need_w else None), (db if need_b else None), None


_linear_op.register_autograd(_linear_autograd, setup_context=_linear_setup_context)


# ------------------------------------------------------------------ autograd (stateful recipes)
class LinearFunction(torch.autograd.Function):
    """The autograd function of :func:`linear` for stateful recipes (``apply(x (T, K), weight (N, K), bias,
    options, state)``, inputs checked by :func:`linear`; ``state`` a :class:`LayerState` for stateful
    recipes, else None: then it computes what the ``fp8sim::linear`` operator does).  It runs eagerly
    also inside ``torch.compile`` (a graph break: :func:`linear`)."""

    @staticmethod
    @ieee_defaults
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias, opts: LinearOptions, state=None) -> torch.Tensor:  # type: ignore[override]
        ctx.opts = opts
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.stateful = None
        if state is not None and x.shape[0] > 0:  # a stateful recipe: fp8sim.training.Linear on the host
            xn = _numpy(x.cpu())
            bn = None if bias is None else _numpy(bias.cpu())
            cached = _host_cache(xn, opts) if opts.caches else None
            yn, ctx.stateful = host_forward(xn, _numpy(weight.cpu()), bn, opts.recipe, opts.fidelity, state, cached)
            ctx.save_for_backward(weight)
            return torch.from_numpy(np.ascontiguousarray(yn)).to(device=x.device, dtype=x.dtype)
        y, saved = _forward(x, weight, bias, opts)
        ctx.save_for_backward(saved if opts.caches else x, weight)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    @ieee_defaults
    def backward(ctx: Any, gy: torch.Tensor):  # type: ignore[override]
        xdt, wdt, bdt = ctx.dtypes
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and bdt is not None
        if ctx.stateful is not None:
            (weight,) = ctx.saved_tensors
            g = gy.detach().cpu()
            dxn, dwn = host_backward(_numpy(g), ctx.stateful)
            ctx.stateful = None
            dx = torch.from_numpy(dxn).to(device=gy.device, dtype=xdt) if need_x else None
            dw = torch.from_numpy(dwn).to(device=gy.device, dtype=wdt) if need_w else None
            db = None
            if need_b:
                db = torch.from_numpy(_numpy(g).astype(np.float64).sum(axis=0)).to(device=gy.device, dtype=bdt)
            return dx, dw, db, None, None
        xs, weight = ctx.saved_tensors
        dx, dw, db = _backward(gy, xs, weight, ctx.opts, xdt, bdt, need_x, need_w, need_b)
        return (dx if need_x else None), (dw if need_w else None), (db if need_b else None), None, None


def _disable(fn, reason: str):
    """``torch.compiler.disable(fn)`` (with its ``reason`` where this torch takes one)."""
    try:
        return torch.compiler.disable(fn, reason=reason)
    except TypeError:  # torch < 2.7: no reason
        return torch.compiler.disable(fn)


def _apply_stateful(x, weight, bias, opts, state):
    return LinearFunction.apply(x, weight, bias, opts, state)


# a stateful recipe keeps host state (amax histories, the step, the saved numpy layer) between its
# forward and backward: torch.compile runs it eagerly, a graph break (fullgraph=True raises)
_apply_stateful = _disable(
    _apply_stateful,
    "fp8sim.torch: a recipe with stateful or random quantization (delayed scaling, stochastic rounding, "
    "NVFP4) keeps host state between calls and runs outside torch.compile's graph",
)


# ------------------------------------------------------------------ checks and the public function
def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"fp8sim.torch.linear: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"fp8sim.torch.linear: {name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.dtype == torch.float16:
        raise TypeError(
            f"fp8sim.torch.linear: {name} is float16, which is not supported: the FP8 recipes write BF16 "
            "values, and float16 does not hold them all (its range ends at 65504, below 2**-14 it loses "
            "bits); use bfloat16 or float32"
        )
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"fp8sim.torch.linear: {name} has dtype {t.dtype}; supported: float32, bfloat16, float64")
    if t.device.type not in _DEVICES:
        raise ValueError(
            f"fp8sim.torch.linear: {name} is on device {str(t.device)!r}; fp8sim runs tensors on 'cpu' and 'cuda'"
        )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    recipe="deepseek-v3",
    fidelity: str = "exact",
    cache=None,
    group_size: int | None = None,
    state: LayerState | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` (``torch.nn.functional.linear``) with Fprop, Dgrad and Wgrad run by
    ``recipe``, bit-identical to fp8sim's numpy API (module docstring).

    Parameters
    ----------
    x : ``(..., K)`` tensor (float32, bfloat16 or float64; any strides; leading dimensions are
        flattened into tokens)
    weight : ``(N, K)`` tensor (torch's layout)
    bias : ``(N,)`` tensor or None
    recipe : a preset name (:func:`fp8sim.recipe_names`) or a :class:`fp8sim.Recipe`; ``"bf16"`` is
        the BF16 baseline through the same path
    fidelity : ``"exact"`` (bit-exact accumulator model) or ``"fast"`` (as :func:`fp8sim.gemm`)
    cache : what Wgrad reads as ``x``: None (``x`` itself), ``"fprop"`` (the values of the Fprop
        GEMM's quantization of ``x``: DeepSeek-V3's FP8 activation cache) or an
        :class:`ActivationCache`
    group_size : None, or per-group scaling of ``group_size`` elements along K (:func:`group_recipe`)
    state : a :class:`LayerState`, needed (and only used) by recipes with stateful or random
        quantization (:func:`fp8sim.torch.stateful.is_stateful`: delayed scaling, stochastic
        rounding of gradients, NVFP4's 2-D weight blocks and Hadamard transform); it keeps the amax
        histories and the step across calls.  :class:`fp8sim.torch.Linear` keeps one per layer

    Returns
    -------
    ``(..., N)`` tensor of ``x``'s dtype on ``x``'s device.  Inside ``torch.autocast(device_type,
    dtype=torch.bfloat16)`` (``x``'s device type), as for ``nn.Linear``, a float32 ``x`` is rounded to
    bfloat16 first (RNE), so the output is bfloat16 and ``grad_x`` float32; the weight and bias are not
    rounded (the recipe quantizes the weight itself); autocast to float16 raises TypeError.
    Errors: TypeError for tensors of other
    dtypes (float16, integers) or layouts, ValueError for other devices, tensors on different
    devices, a weight that is not 2-D or empty, ``x`` without a K axis of ``weight.shape[1]``, a
    bias that is not ``(N,)``.
    """
    opts = recipe if isinstance(recipe, LinearOptions) else None
    if opts is None:
        opts = options(recipe, fidelity=fidelity, cache=cache, group_size=group_size)
    _check_tensor(x, "x")
    _check_tensor(weight, "weight")
    if bias is not None:
        _check_tensor(bias, "bias")
    devices = {t.device for t in (x, weight, bias) if t is not None}
    if len(devices) > 1:
        raise ValueError(
            f"fp8sim.torch.linear: x, weight and bias are on different devices: {sorted(map(str, devices))}"
        )
    if weight.dim() != 2:
        raise ValueError(
            f"fp8sim.torch.linear: weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}"
        )
    N, K = weight.shape
    if N == 0 or K == 0:
        raise ValueError(f"fp8sim.torch.linear: weight must not be empty, got shape {tuple(weight.shape)}")
    if x.dim() == 0 or x.shape[-1] != K:
        raise ValueError(
            f"fp8sim.torch.linear: x has shape {tuple(x.shape)}; its last dimension must be in_features = {K} "
            f"(weight is {tuple(weight.shape)})"
        )
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"fp8sim.torch.linear: bias must have shape ({N},), got {tuple(bias.shape)}")
    if opts._stateful:
        if state is None:
            raise ValueError(
                f"fp8sim.torch.linear: recipe {opts.recipe.name!r} has stateful or random quantization (delayed "
                "scaling, stochastic rounding, 2-D weight blocks or a Hadamard transform): pass "
                "state=fp8sim.torch.LayerState(name, seed) and keep it across steps, or use fp8sim.torch.Linear"
            )
        if not isinstance(state, LayerState):
            raise TypeError(f"fp8sim.torch.linear: state must be a LayerState, got {type(state).__name__}")
    else:
        state = None
    adt = _autocast_dtype(x.device.type)
    if adt is not None:  # as nn.Linear under torch.autocast: float32 activations are rounded to bfloat16
        if adt == torch.float16:
            raise TypeError(
                "fp8sim.torch.linear: torch.autocast with dtype float16 is active; fp8sim's FP8 recipes write "
                "BF16 values, which float16 does not hold (its range ends at 65504, below 2**-14 it loses "
                "bits): use torch.autocast(..., dtype=torch.bfloat16)"
            )
        if adt == torch.bfloat16 and x.dtype == torch.float32:
            x = x.to(torch.bfloat16)
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, K)
    if state is not None:
        y = _apply_stateful(x2, weight, bias, opts, state)
    else:
        y = torch.ops.fp8sim.linear(x2, weight, bias, opts._key)[0]
    return y.reshape(lead + (N,))


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype of the ``torch.autocast`` region enabled for ``device_type``, or None."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):  # pragma: no cover - torch before the device-generic autocast API
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
