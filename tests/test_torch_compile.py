"""torch.compile of converted models: fp8sim's GEMMs are custom operators (``torch.ops.fp8sim.linear``,
``linear_backward``) that the compiler treats as opaque, so a compiled model computes the uncompiled
model's bits, forward and backward, with no graph break (``fullgraph=True``).  Stateful recipes run
eagerly inside a compiled model (a graph break) and give the same bits; ``fullgraph=True`` refuses
them with a message naming the reason."""

from __future__ import annotations

import contextlib
import copy
import inspect
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fp8sim  # noqa: E402
import fp8sim.torch as ft  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().copy()
    return np.ascontiguousarray(t.numpy()).view({4: np.uint32, 8: np.uint64}[t.element_size()])


def assert_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(bits(a), bits(b)), f"{int((bits(a) != bits(b)).sum())} of {a.numel()} elements differ"


class Net(torch.nn.Module):
    """Linear layers named as in Llama-style models, ReLU and residual adds (operations whose compiled
    code gives eager's bits), a bias-free head (skipped: a plain nn.Linear)."""

    def __init__(self, d=64, vocab=40):
        super().__init__()
        self.q_proj = torch.nn.Linear(d, d)
        self.o_proj = torch.nn.Linear(d, d, bias=False)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        h = x + self.o_proj(torch.relu(self.q_proj(x)))
        h = h + self.down(torch.relu(self.up(h)))
        return self.lm_head(h)


def step(model, x, dy):
    """Forward and backward: the output, grad_x and every parameter's gradient."""
    x = x.clone().requires_grad_()
    y = model(x)
    y.backward(dy)
    return [y, x.grad] + [p.grad for p in model.parameters()]


def inductor_available() -> bool:
    return shutil.which("g++") is not None or shutil.which("c++") is not None


BACKENDS = [
    "eager",
    "aot_eager",
    pytest.param(
        "inductor", marks=pytest.mark.skipif(not inductor_available(), reason="inductor needs a C++ compiler")
    ),
]


@pytest.fixture
def stack():
    with contextlib.ExitStack() as s:
        yield s


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "spec, dtype",
    [("deepseek-v3", torch.float32), ("te-hybrid", torch.bfloat16)],
    ids=["deepseek-v3-plan-fp32", "te-hybrid-bf16"],
)
def test_compiled_model_gives_the_uncompiled_bits(backend, spec, dtype, stack):
    """convert(model, "deepseek-v3") (the plan: FP8 and E5M6 activation caches) and te-hybrid (E5M2
    gradients) on a bfloat16 model; torch.compile(fullgraph=True): output, grad_x and every
    parameter gradient bit-identical to the same converted model uncompiled, over two batch sizes
    (the second call recompiles with a dynamic token count)."""
    if backend == "inductor" and dtype == torch.bfloat16:
        # inductor computes fused bfloat16 elementwise operations (the residual adds, autograd's sum of
        # the gradients of x) in float32 and rounds once; eager torch rounds after each one
        inductor_config = pytest.importorskip("torch._inductor.config")
        if not hasattr(inductor_config, "emulate_precision_casts"):
            pytest.skip("this torch's inductor cannot round bfloat16 intermediates as eager torch does")
        stack.enter_context(inductor_config.patch(emulate_precision_casts=True))
    torch.manual_seed(0)
    ref = ft.convert(Net().to(dtype), spec)
    comp = copy.deepcopy(ref)
    compiled = torch.compile(comp, backend=backend, fullgraph=True)
    for T in (24, 20):
        x = torch.randn(2, T, 64).to(dtype)
        dy = (torch.randn(2, T, 40) * 1e-2).to(dtype)
        for m in (ref, comp):
            m.zero_grad(set_to_none=True)
        want, got = step(ref, x, dy), step(compiled, x, dy)
        assert len(want) == 2 + 8  # y, grad_x, 8 parameters
        for a, b in zip(want, got):
            assert_bits(b, a)


def test_functional_linear_compiles():
    """fp8sim.torch.linear with LinearOptions inside a compiled function, fullgraph."""
    opts = ft.options("deepseek-v3", cache="fprop")
    x = torch.randn(48, 160)
    w = torch.randn(96, 160) * 0.05
    b = torch.randn(96)

    def f(x, w, b):
        return ft.linear(x, w, b, recipe=opts)

    ins = [t.clone().requires_grad_() for t in (x, w, b)]
    cins = [t.clone().requires_grad_() for t in (x, w, b)]
    y = f(*ins)
    yc = torch.compile(f, backend="aot_eager", fullgraph=True)(*cins)
    assert_bits(yc, y)
    dy = torch.randn(48, 96) * 1e-3
    y.backward(dy)
    yc.backward(dy)
    for a, c in zip(ins, cins):
        assert_bits(c.grad, a.grad)


def test_operators_pass_opcheck():
    """torch.library.opcheck: the fake implementations, schema and autograd registration agree with the
    real operator (the checks torch.compile relies on)."""
    x = torch.randn(40, 96, requires_grad=True)
    w = (torch.randn(64, 96) * 0.05).requires_grad_()
    b = torch.randn(64, requires_grad=True)
    for o in (ft.options("deepseek-v3"), ft.options("deepseek-v3", cache=ft.DEEPSEEK_ATTN_OUT_CACHE)):
        torch.library.opcheck(torch.ops.fp8sim.linear.default, (x, w, b, o._key))
        torch.library.opcheck(torch.ops.fp8sim.linear.default, (x, w, None, o._key))
    gy = torch.randn(40, 64) * 1e-3
    args = (gy, x.detach(), w.detach(), o._key, torch.float32, torch.float32, True, True, True)
    torch.library.opcheck(torch.ops.fp8sim.linear_backward.default, args)


def stateful_recipe():
    """Delayed scaling: the amax history of each operand carries from step to step."""
    from fp8sim.scaling import DelayedScaling

    return fp8sim.recipe("deepseek-v3").with_(
        name="delayed",
        x_granularity=DelayedScaling(4),
        w_granularity=DelayedScaling(4),
        promote_every=128,
        scale_at="epilogue",
    )


@pytest.mark.parametrize("recipe", ["delayed", "nvfp4"])
def test_stateful_recipe_runs_eagerly_inside_compile(recipe):
    """A stateful recipe (delayed scaling; NVFP4's stochastic rounding) in a compiled model: over three
    steps of changing amaxes, the same bits and the same LayerState as the uncompiled model."""
    r = stateful_recipe() if recipe == "delayed" else fp8sim.recipe(recipe)
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    ft.convert(ref, r, seed=7)
    comp = copy.deepcopy(ref)
    compiled = torch.compile(comp, backend="eager")
    for s in range(3):
        x = torch.randn(64, 128) * 2.0**s
        dy = torch.randn(64, 32) * 2.0**-s
        want, got = step(ref, x, dy), step(compiled, x, dy)
        for a, b in zip(want, got):
            assert_bits(b, a)
        ref.zero_grad(set_to_none=True)
        comp.zero_grad(set_to_none=True)
    assert comp[0].state.step == ref[0].state.step == 3
    assert comp[0].state.delayed.keys() == ref[0].state.delayed.keys()


def test_stateful_recipe_with_fullgraph_raises_naming_the_reason():
    m = ft.convert(torch.nn.Sequential(torch.nn.Linear(128, 64)), stateful_recipe(), skip=())
    takes_reason = "reason" in inspect.signature(torch.compiler.disable).parameters
    with pytest.raises(Exception, match="stateful or random quantization" if takes_reason else "disable"):
        torch.compile(m, backend="eager", fullgraph=True)(torch.randn(8, 128))


def test_pickled_model_runs_in_another_process():
    """The operators take a process-local key of the layer's options; a converted model pickled in one
    process computes the same bits in another that registered other options first."""
    torch.manual_seed(2)
    m = ft.convert(Net(), "deepseek-v3")
    x = torch.randn(2, 24, 64)
    with torch.no_grad():
        y = m(x)
    code = (
        "import pickle, sys, torch\n"
        "import fp8sim.torch as ft\n"
        "for r in ('bf16', 'fp32', 'per-tensor', 'te-hybrid'):\n"
        "    ft.options(r)\n"
        "m, x = pickle.loads(sys.stdin.buffer.read())\n"
        "with torch.no_grad():\n"
        "    sys.stdout.buffer.write(pickle.dumps(m(x)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps((m, x)), capture_output=True, cwd=ROOT, timeout=900
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert_bits(pickle.loads(out.stdout), y)
