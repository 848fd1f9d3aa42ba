"""Estimated Cortex-M cycles of the kernels a program calls, one rule per kernel: the CMSIS-NN function its
wrapper picks for the call's shapes, that function's loop counts, and a cost per loop iteration for the core's
instruction-set class (``Timing``), plus the weights it streams from the model's memory (``Board``).

Where the MVE costs come from: the loop structure of CMSIS-NN (ExecuTorch 1.5.1's pin, v7.0.0 plus fixes) and
the Cortex-M55's dual-beat MVE pipes (LLVM's Arm-written M55 scheduling model) give each loop's shape; five
constants are then measured on MobileNetV2's layers on an Alif E8 Cortex-M55 (ExecuTorch issue 17651: activations
in SRAM, weights in MRAM): no network of the comparison in ``make bench -- cortex-m`` was used. DSP and scalar
costs are instruction counts of CMSIS-NN's DSP and C loops, not checked against silicon."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from math import ceil, prod


@dataclass(frozen=True)
class Tensor:
    """What an estimate reads of a tensor argument: its logical (NCHW) shape and element size."""

    shape: tuple[int, ...]
    itemsize: int = 1

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class Estimate:
    """One kernel call's estimated cycles, the CMSIS-NN function (or portable loop) that runs, its MACs."""

    cycles: int
    function: str
    macs: int = 0


@dataclass(frozen=True)
class Timing:
    """Cycles per iteration of one instruction-set class's loops. A GEMM block is ``rows`` output pixels by
    ``cols`` output channels over ``step`` bytes of the reduction; an output outside whole blocks costs
    ``tail_step`` per step and ``tail_epilogue``."""

    isa: str
    rows: int
    cols: int
    step: int
    block_step: float  # one block, one reduction step
    block_epilogue: float  # bias, requantize, clamp and store of one block
    tail_step: float
    tail_epilogue: float
    im2col_tap: float  # one kernel tap's copy (call and setup) in an im2col buffer
    copy_16: float  # 16 bytes of any copy
    dw_tap: float  # a depthwise output's one kernel tap
    dw_output: float  # a depthwise output's requantize and store
    quantize: float  # one element of float <-> int8
    add: float  # an element of arm_elementwise_add_s8 (three requantizes)
    mul: float  # an element of arm_elementwise_mul_s8 (one requantize)
    div: float  # an element of quantized_div: conversions, a float divide and multiply, a rounding
    pool_tap: float  # 16 channels of one average-pool window element (widen and add)
    pool_output: float  # an average-pool output's divide, clamp and store
    max_tap: float  # 16 channels of one max-pool window element (load, max, store)
    softmax: float  # an element of arm_softmax_s8 (max, exp-sum and scale passes)
    table: float  # one element through a 256-entry table
    float_mac: float  # a portable float kernel's multiply-accumulate (scalar C loops)
    float_element: float  # a portable kernel's element of elementwise work
    scale: float = 1.0  # measured cycles over the counts above, on a reference system


# MVE: rows/cols/step from arm_nn_mat_mult_nt_t_s8's 4x1 inner loop (5 loads, 4 VMLADAVA and a VADDVA per 16
# bytes: 10 load-pipe cycles, the bound). block_* fitted to MobileNetV2's four pointwise layers (each within 4%),
# im2col_tap to its 3x3 stem, dw_* to its three 3x3 depthwise layers (34.1 cycles an output, split 3:1 between
# taps and epilogue as the instruction counts are), quantize to its input quantize (9.1 cycles an element).
# tail_*: the one-row loop (2 loads a step) at the block's measured/ideal ratio (1.36). The rest are pipe-bound
# instruction counts (2 cycles a vector instruction): add 21 integer-pipe operations per 4 elements, mul 10, the
# average pool 10 per window element and 16 scalar divides per 16 outputs, the max pool 3 loads and stores;
# quantized_div is scalar float code around a VDIV.F32 (14 cycles on the M4, M7 and M55 FPUs; a software divide
# of about 200 on the cores without one).
MVE = Timing("MVE", rows=4, cols=1, step=16, block_step=13.56, block_epilogue=67.2, tail_step=5.4,
             tail_epilogue=25.0, im2col_tap=34.0, copy_16=4.0, dw_tap=2.84, dw_output=8.5, quantize=9.1,
             add=10.5, mul=5.0, div=24.0, pool_tap=20.0, pool_output=9.0, max_tap=6.0, softmax=30.0, table=2.0,
             float_mac=6.0, float_element=8.0)
# DSP (SMLAD): arm_nn_mat_mult_kernel_s8_s16's 2x2 block over 4 int16 pairs: 8 SMLAD, 4 activation and 2 weight
# loads, 4 sign extensions; requantize in scalar code (a 64-bit multiply and shifts). ``scale``: MLPerf Tiny v1.1's
# ResNet-8 (IC) on an nRF5340's Cortex-M33 at 128 MHz with CMSIS-NN (Krai, closed division) takes 2.52 times the
# count; its other three networks, and the four on an STM32L4R5's Cortex-M4, are the check (``make bench``).
DSP = Timing("DSP", rows=2, cols=2, step=4, block_step=18.0, block_epilogue=44.0, tail_step=6.0,
             tail_epilogue=12.0, im2col_tap=20.0, copy_16=12.0, dw_tap=2.5, dw_output=14.0, quantize=12.0,
             add=12.0, mul=7.0, div=28.0, pool_tap=32.0, pool_output=10.0, max_tap=20.0, softmax=40.0, table=3.0,
             float_mac=8.0, float_element=10.0, scale=2.52)
# Scalar C (Cortex-M0/M3): a byte load each side, a multiply and an add per MAC, and the loop.
SCALAR = Timing("SCALAR", rows=1, cols=1, step=1, block_step=8.0, block_epilogue=24.0, tail_step=8.0,
                tail_epilogue=24.0, im2col_tap=24.0, copy_16=24.0, dw_tap=9.0, dw_output=24.0, quantize=40.0,
                add=30.0, mul=18.0, div=200.0, pool_tap=80.0, pool_output=20.0, max_tap=96.0, softmax=80.0,
                table=4.0, float_mac=60.0, float_element=60.0)
TIMINGS = {t.isa: t for t in (MVE, DSP, SCALAR)}


@dataclass(frozen=True)
class Board:
    """Where the model's weights live: a data cache of ``cache_bytes`` before a memory that fills a
    ``line_bytes`` line in ``line_cycles`` core cycles; weights that do not fit are read again on every pass."""

    name: str
    clock_hz: float
    cache_bytes: int
    line_bytes: int
    line_cycles: float

    def stream(self, weight_bytes: int, passes: int) -> float:
        """Cycles to read ``weight_bytes`` of weights ``passes`` times."""
        reads = 1 if weight_bytes <= self.cache_bytes else passes
        return weight_bytes * reads * self.line_cycles / self.line_bytes


# Alif E8, Cortex-M55 at 400 MHz: 32 KiB data cache, 32-byte lines; the model in non-volatile memory modelled as
# Vela's OffChipFlash of its Ethos_U55_High_End_Embedded system (1/8 of the core clock on a 64-bit bus, 64 cycles
# of latency, two reads in flight): 32 + 32 cycles a line. Alif publishes no MRAM timing.
ALIF_E8 = Board("Alif E8 (Cortex-M55, 400 MHz, weights in MRAM)", 400e6, 32 * 1024, 32, 64.0)
# The other cores: a part's usual top clock for the milliseconds (e.g. STM32H7's M7 at 480 MHz, nRF5340's M33 at
# 128 MHz, RA8D1's M85 at 480 MHz), weights read without wait states.
CORE_MHZ = {"cortex-m0": 48, "cortex-m0plus": 48, "cortex-m3": 72, "cortex-m23": 48, "cortex-m4": 120,
            "cortex-m7": 480, "cortex-m33": 128, "cortex-m35p": 160, "cortex-m85": 480}


def board_for(core: str) -> Board:
    """The system a core's estimate assumes: the Alif E8 for a Cortex-M55, else the core with wait-free memory."""
    if core == "cortex-m55":
        return ALIF_E8
    return Board(f"{core} at {CORE_MHZ[core]} MHz, weights read without wait states", CORE_MHZ[core] * 1e6, 0, 32,
                 0.0)

Rule = Callable[[dict, Timing, Board], Estimate]
RULES: dict[str, Rule] = {}


def rule(*kernels: str):
    """Register an estimate for these kernels (``namespace::name.overload``)."""
    def register(fn: Rule) -> Rule:
        RULES.update(dict.fromkeys(kernels, fn))
        return fn
    return register


def estimate(kernel: str, args: dict, isa: str, board: Board) -> Estimate | None:
    """The call's estimate on a core of ``isa``, or None for a kernel without a rule."""
    found, timing = RULES.get(kernel), TIMINGS[isa]
    return None if found is None else _scaled(found(args, timing, board), timing)


def _scaled(e: Estimate, t: Timing) -> Estimate:
    return e if t.scale == 1.0 else replace(e, cycles=round(e.cycles * t.scale))


def gemm(t: Timing, pixels: int, channels: int, depth: int) -> float:
    """Cycles of an int8 matrix product: ``pixels`` x ``channels`` outputs over a ``depth``-long reduction."""
    steps = ceil(depth / t.step)
    blocks = (pixels // t.rows) * (channels // t.cols)
    tail = pixels * channels - blocks * t.rows * t.cols
    return blocks * (t.block_epilogue + t.block_step * steps) + tail * (t.tail_epilogue + t.tail_step * steps)


def _copy(t: Timing, nbytes: int) -> float:
    return t.copy_16 * ceil(nbytes / 16)


def _conv_shapes(args: dict) -> tuple[int, int, int, int, int, int, int]:
    """(batch, input channels, output pixels per image, output channels, KH, KW, weight bytes)."""
    x, w, out = args["input"], args["weight"], args["out"]
    return x.shape[0], x.shape[1], out.shape[2] * out.shape[3], out.shape[1], w.shape[1], w.shape[2], w.numel


def _convolve(t: Timing, board: Board, batch: int, cin: int, pixels: int, cout: int, taps: int,
              weight_bytes: int, name: str = "arm_convolve_s8") -> Estimate:
    """arm_convolve_s8: an im2col copy of each output pixel's taps, then the matrix product in blocks."""
    depth = taps * cin
    cycles = batch * (pixels * taps * (t.im2col_tap + _copy(t, cin) - t.copy_16) + gemm(t, pixels, cout, depth))
    passes = batch * max(pixels // t.rows, 1)
    return Estimate(round(cycles + board.stream(weight_bytes, passes)), name, batch * pixels * cout * depth)


@rule("cortex_m::quantized_conv2d.out")
def _conv2d(args: dict, t: Timing, board: Board) -> Estimate:
    batch, cin, pixels, cout, kh, kw, wbytes = _conv_shapes(args)
    pointwise = (kh, kw) == (1, 1) and tuple(args["padding"]) == (0, 0) and tuple(args["dilation"]) == (1, 1)
    if pointwise and args["weight"].shape[3] == cin:
        macs = batch * pixels * cout * cin
        if tuple(args["stride"]) == (1, 1):  # arm_convolve_1x1_s8_fast: one product over the whole batch
            cycles = gemm(t, batch * pixels, cout, cin) + board.stream(wbytes, batch * pixels // t.rows)
            return Estimate(round(cycles), "arm_convolve_1x1_s8_fast", macs)
        rows, width = args["out"].shape[2], args["out"].shape[3]  # arm_convolve_1x1_s8: a product per row
        cycles = batch * rows * gemm(t, width, cout, cin) + board.stream(wbytes, batch * rows * max(width // 4, 1))
        return Estimate(round(cycles), "arm_convolve_1x1_s8", macs)
    return _convolve(t, board, batch, args["weight"].shape[3], pixels, cout, kh * kw, wbytes)


@rule("cortex_m::quantized_depthwise_conv2d.out")
def _depthwise(args: dict, t: Timing, board: Board) -> Estimate:
    batch, cin, pixels, cout, kh, kw, wbytes = _conv_shapes(args)
    taps, outputs = kh * kw, batch * pixels * cout
    if t.isa == "MVE" and cin == 1 and cout > 1:  # the wrapper's conversion of one input channel (GCC builds)
        return _convolve(t, board, batch, 1, pixels, cout, taps, wbytes, "arm_depthwise_conv_s8 as arm_convolve_s8")
    if args["depth_multiplier"] == 1 and tuple(args["dilation"]) == (1, 1) and batch == 1:
        name = "arm_depthwise_conv_3x3_s8" if t.isa == "DSP" and (kh, kw) == (3, 3) and \
            max(args["padding"]) <= 1 else "arm_depthwise_conv_s8_opt"
        cycles = outputs * (t.dw_output + t.dw_tap * taps)
    else:  # the generic kernel: one output at a time
        name, cycles = "arm_depthwise_conv_s8", outputs * (t.tail_epilogue + t.tail_step * taps)
    return Estimate(round(cycles + board.stream(wbytes, 1)), name, outputs * taps)


@rule("cortex_m::quantized_transpose_conv2d.out")
def _transpose_conv(args: dict, t: Timing, board: Board) -> Estimate:
    x, w, out = args["input"], args["weight"], args["out"]
    batch, cin, pixels = x.shape[0], x.shape[1], x.shape[2] * x.shape[3]
    cout, taps = out.shape[1], w.shape[1] * w.shape[2]
    macs = batch * pixels * cin * cout * taps  # every input pixel scattered over the kernel
    cycles = batch * gemm(t, pixels * taps, cout, cin) + _copy(t, out.numel) * 4  # int32 accumulators
    return Estimate(round(cycles + board.stream(w.numel, 1)), "arm_transpose_conv_wrapper_s8", macs)


@rule("cortex_m::quantized_linear.out")
def _linear(args: dict, t: Timing, board: Board) -> Estimate:
    x, w = args["input"], args["weights"]
    rows, (channels, depth) = x.numel // x.shape[-1], w.shape
    cycles = rows * gemm(_vector_rows(t), channels, 1, depth) + board.stream(w.numel, rows)
    return Estimate(round(cycles), "arm_fully_connected_s8", rows * channels * depth)


def _vector_rows(t: Timing) -> Timing:
    """arm_nn_vec_mat_mult_t_s8: the same block as the matrix product, over weight rows instead of pixels."""
    return replace(t, rows=t.rows * t.cols, cols=1)


@rule("cortex_m::quantized_batch_matmul.out")
def _batch_matmul(args: dict, t: Timing, board: Board) -> Estimate:
    lhs, rhs = args["lhs"], args["rhs_transposed"]
    batches, rows, depth, cols = lhs.numel // (lhs.shape[-2] * lhs.shape[-1]), lhs.shape[-2], lhs.shape[-1], \
        rhs.shape[-2]
    cycles = batches * (gemm(t, rows, cols, depth) + board.stream(rhs.numel // batches, max(rows // t.rows, 1)))
    return Estimate(round(cycles), "arm_batch_matmul_s8", batches * rows * cols * depth)


# Kernels that cost a figure of ``Timing`` per element of one tensor: (figure, tensor, what runs).
PER_ELEMENT = {
    "cortex_m::quantized_add.out": ("add", "out", "arm_elementwise_add_s8"),
    "cortex_m::quantized_mul.out": ("mul", "out", "arm_elementwise_mul_s8"),
    "cortex_m::quantized_div.out": ("div", "out", "float divide loop"),
    "cortex_m::quantized_activation.out": ("table", "input", "table lookup"),
    "cortex_m::softmax.out": ("softmax", "input", "arm_softmax_s8"),
    **{f"{namespace}::{op}_per_tensor.out": ("quantize", "input", f"{op} loop")
       for namespace in ("cortex_m", "quantized_decomposed") for op in ("quantize", "dequantize")},
}


def _per_element(figure: str, tensor: str, function: str) -> Rule:
    return lambda args, t, board: Estimate(round(args[tensor].numel * getattr(t, figure)), function)


for _kernel, _how in PER_ELEMENT.items():
    rule(_kernel)(_per_element(*_how))


def _pool(args: dict, per_tap: float, per_output: float, function: str) -> Estimate:
    """CMSIS-NN's pools: 16 channels at a time, each window element a pass over them."""
    out, (kh, kw) = args["out"], args["kernel_size"]
    blocks = out.numel // out.shape[1] * ceil(out.shape[1] / 16)
    return Estimate(round(blocks * kh * kw * per_tap + out.numel * per_output), function)


@rule("cortex_m::quantized_avg_pool2d.out")
def _avg_pool(args: dict, t: Timing, board: Board) -> Estimate:
    return _pool(args, t.pool_tap, t.pool_output, "arm_avgpool_s8")


@rule("cortex_m::quantized_max_pool2d.out")
def _max_pool(args: dict, t: Timing, board: Board) -> Estimate:
    return _pool(args, t.max_tap, t.copy_16 / 16, "arm_max_pool_s8")  # then a clamp pass over the output


@rule("cortex_m::transpose.out", "cortex_m::pad.out", "aten::view_copy.out", "aten::clone.out",
      "aten::permute_copy.out", "aten::slice_copy.Tensor_out", "aten::cat.out", "aten::expand_copy.out",
      "dim_order_ops::_clone_dim_order.out", "dim_order_ops::_to_dim_order_copy.out")
def _move(args: dict, t: Timing, board: Board) -> Estimate:
    out = args["out"]
    return Estimate(round(_copy(t, out.numel * out.itemsize)), "copy")


@rule("cortex_m::minimum.out", "cortex_m::maximum.out")
def _min_max(args: dict, t: Timing, board: Board) -> Estimate:
    return Estimate(round(3 * _copy(t, args["out"].numel)), "elementwise min/max")


@rule("aten::convolution.out")
def _float_convolution(args: dict, t: Timing, board: Board) -> Estimate:
    w, out = args["weight"], args["out"]
    macs = out.numel * w.numel // w.shape[0]
    return Estimate(round(macs * t.float_mac), "portable float loop", macs)


@rule("aten::addmm.out", "aten::mm.out", "aten::bmm.out", "aten::linear.out")
def _float_matmul(args: dict, t: Timing, board: Board) -> Estimate:
    tensors = [v for v in args.values() if isinstance(v, Tensor)]
    out = args["out"]
    depth = max(v.shape[-1] for v in tensors if v is not out and v.shape)
    return Estimate(round(out.numel * depth * t.float_mac), "portable float loop", out.numel * depth)


def portable_elementwise(kernel: str, args: dict, isa: str) -> Estimate | None:
    """A portable kernel without a rule that writes one ``out`` tensor: its elements at the elementwise cost."""
    out, timing = args.get("out"), TIMINGS[isa]
    if not isinstance(out, Tensor):
        return None
    return _scaled(Estimate(round(out.numel * timing.float_element), "portable loop (elementwise estimate)"), timing)
