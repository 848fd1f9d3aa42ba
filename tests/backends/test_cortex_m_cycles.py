"""The Cortex-M cycle estimates: CMSIS-NN's choice of function per call, the MVE costs against the MobileNetV2
layers they were measured on, weights streamed past the cache, and the tables inspect and the report print."""

from __future__ import annotations

import pytest
import torch

from tosakit.backends.cortex_m.cycles import ALIF_E8, Tensor, board_for, estimate
from tosakit.program.kernels import kernel_schemas


def _conv(cin, cout, size, k=1, stride=1, pad=0, groups=1, batch=1, dilation=1):
    out = (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    depthwise = groups > 1
    weight = Tensor((1, k, k, cout)) if depthwise else Tensor((cout, k, k, cin // groups))
    args = {"input": Tensor((batch, cin, size, size)), "weight": weight, "stride": (stride, stride),
            "padding": (pad, pad), "dilation": (dilation, dilation), "out": Tensor((batch, cout, out, out))}
    if depthwise:
        args["depth_multiplier"] = cout // cin
    return args


CONV, DEPTHWISE = "cortex_m::quantized_conv2d.out", "cortex_m::quantized_depthwise_conv2d.out"
# MobileNetV2's first layers on an Alif E8 Cortex-M55 (ExecuTorch issue 17651): (kernel, args, cycles measured).
MEASURED = [
    (CONV, _conv(3, 32, 224, 3, 2, 1), 13_754_047),
    (DEPTHWISE, _conv(32, 32, 112, 3, 1, 1, groups=32), 13_715_766),
    (CONV, _conv(32, 16, 112), 4_915_937),
    (CONV, _conv(16, 96, 112), 24_249_462),
    (DEPTHWISE, _conv(96, 96, 112, 3, 2, 1, groups=96), 10_286_711),
    (CONV, _conv(96, 24, 56), 2_791_555),
    (CONV, _conv(24, 144, 56), 10_329_014),
    (DEPTHWISE, _conv(144, 144, 56, 3, 1, 1, groups=144), 15_319_785),
    ("cortex_m::quantize_per_tensor.out", {"input": Tensor((1, 3, 224, 224), 4)}, 1_365_831),
]


@pytest.mark.parametrize("kernel,args,cycles", MEASURED, ids=[f"{k.split('::')[1][:-4]}{i}" for i, (k, _, _)
                                                              in enumerate(MEASURED)])
def test_mve_costs_give_the_mobilenet_v2_layers_they_were_measured_on(kernel, args, cycles):
    """Each layer within 5% of its measured cycles: five constants for nine layers of four CMSIS-NN functions."""
    got = estimate(kernel, args, "MVE", ALIF_E8).cycles
    assert abs(got / cycles - 1) < 0.05, (got, cycles)


@pytest.mark.parametrize("isa,kernel,args,function", [
    ("MVE", CONV, _conv(16, 32, 8), "arm_convolve_1x1_s8_fast"),
    ("MVE", CONV, _conv(16, 32, 8, stride=2), "arm_convolve_1x1_s8"),
    ("MVE", CONV, _conv(16, 32, 8, pad=1), "arm_convolve_s8"),
    ("MVE", CONV, _conv(16, 32, 8, k=3, pad=1), "arm_convolve_s8"),
    ("MVE", DEPTHWISE, _conv(1, 64, 8, k=3, groups=1) | {"weight": Tensor((1, 3, 3, 64)), "depth_multiplier": 64},
     "arm_depthwise_conv_s8 as arm_convolve_s8"),
    ("DSP", DEPTHWISE, _conv(1, 64, 8, k=3, groups=1) | {"weight": Tensor((1, 3, 3, 64)), "depth_multiplier": 64},
     "arm_depthwise_conv_s8"),
    ("MVE", DEPTHWISE, _conv(8, 8, 8, k=3, pad=1, groups=8), "arm_depthwise_conv_s8_opt"),
    ("DSP", DEPTHWISE, _conv(8, 8, 8, k=3, pad=1, groups=8), "arm_depthwise_conv_3x3_s8"),
    ("DSP", DEPTHWISE, _conv(8, 8, 8, k=3, pad=2, groups=8), "arm_depthwise_conv_s8_opt"),
    ("MVE", DEPTHWISE, _conv(8, 8, 8, k=3, pad=2, groups=8, dilation=2), "arm_depthwise_conv_s8"),
    ("MVE", DEPTHWISE, _conv(8, 8, 8, k=3, pad=1, groups=8, batch=2), "arm_depthwise_conv_s8"),
])
def test_the_wrapper_picks_the_cmsis_nn_function(isa, kernel, args, function):
    """CMSIS-NN's wrappers' rules: 1x1 fast or strided, im2col, ExecuTorch's GCC build turning a one-channel
    depthwise into a convolution on MVE, the 3x3 depthwise on DSP, the generic depthwise otherwise."""
    assert estimate(kernel, args, isa, board_for("cortex-m55")).function == function


def test_weights_past_the_cache_are_read_again_on_every_pass():
    """ResNet-8's last convolution (64 x 576 weights, 36 KiB) streams its weights for each 4 pixels; with 48
    output channels (27 KiB) they stay in the 32 KiB cache. A linear layer reads its weights once."""
    big = estimate(CONV, _conv(64, 64, 8, 3, pad=1), "MVE", ALIF_E8)
    small = estimate(CONV, _conv(64, 48, 8, 3, pad=1), "MVE", ALIF_E8)
    assert big.cycles / big.macs > 1.5 * small.cycles / small.macs
    streamed = 64 * 576 * 16 * ALIF_E8.line_cycles / ALIF_E8.line_bytes  # 16 passes of 4 of the 64 pixels
    assert big.cycles - streamed < 1.1 * small.cycles * 64 / 48
    fc = {"input": Tensor((1, 640)), "weights": Tensor((128, 640)), "out": Tensor((1, 128))}
    wait_free = estimate("cortex_m::quantized_linear.out", fc, "MVE", board_for("cortex-m85"))
    assert estimate("cortex_m::quantized_linear.out", fc, "MVE", ALIF_E8).cycles - wait_free.cycles == \
        128 * 640 * 2


def test_every_cortex_m_kernel_has_a_rule():
    """No kernel of the Cortex-M library is left without an estimate."""
    from tosakit.backends.cortex_m.cycles import RULES

    assert not {k for k in kernel_schemas() if k.startswith("cortex_m::")} - set(RULES)


def test_dsp_and_scalar_cores_cost_more_cycles_than_mve():
    """The same call counts more cycles with SMLAD than with Helium, and more again in scalar code."""
    args = _conv(32, 32, 16, 3, pad=1)
    mve, dsp, scalar = (estimate(CONV, args, isa, board_for("cortex-m85")).cycles for isa in ("MVE", "DSP", "SCALAR"))
    assert mve < dsp < scalar


def test_inspect_prints_each_kernel_and_the_total_for_the_chosen_core(tmp_path, capsys):
    """`inspect --cpu`: a line per kernel call with its CMSIS-NN function (a portable kernel at its elementwise
    cost), then the total at the core's clock."""
    from tosakit.cli import main
    from tosakit.flow import compile

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.conv(x).relu().mean((2, 3))).cumsum(1)

    torch.manual_seed(0)
    inputs = (torch.randn(1, 3, 8, 8),)
    (tmp_path / "n.pte").write_bytes(compile(Net().eval(), inputs, "cortex-m55", quantize=True).program.buffer)
    outs = {}
    for core in ("cortex-m55", "cortex-m33", "cortex-m0"):
        assert main(["inspect", str(tmp_path / "n.pte"), "--cpu", core]) == 0
        outs[core] = capsys.readouterr().out
    table = outs["cortex-m55"].split("CPU kernels on cortex-m55")[1]
    assert "arm_convolve_s8, 13,824 MACs" in table and "arm_fully_connected_s8, 32 MACs" in table
    assert "aten::cumsum.out" in table and "portable loop" in table
    totals = {core: int(out.split("total: ")[1].split(" cycles")[0].replace(",", "")) for core, out in outs.items()}
    assert totals["cortex-m55"] < totals["cortex-m33"] < totals["cortex-m0"]
    assert "ms at 400 MHz" in outs["cortex-m55"] and "ms at 128 MHz" in outs["cortex-m33"]


def test_a_kernel_without_a_rule_is_named_and_left_out_of_the_total():
    """A call the rules cannot estimate says so on its line and in the total, which counts the others."""
    from tosakit.backends.cortex_m.cycles import Estimate
    from tosakit.runtime.cpu_cycles import CpuCycles, KernelCycles

    calls = (KernelCycles(0, "cortex_m::quantized_add.out", Estimate(400, "arm_elementwise_add_s8")),
             KernelCycles(1, "aten::split_with_sizes_copy.out", None))
    c = CpuCycles("forward", "cortex-m55", ALIF_E8, calls)
    lines = c.lines()
    assert "no estimate for this kernel" in lines[2] and c.total == 400
    assert lines[-1].endswith("without 1 kernel(s) it has no rule for")
    assert "(without aten::split_with_sizes_copy.out)" in c.summary()


def test_the_compile_report_estimates_the_cpu_kernels_on_the_fallback_core(tmp_path, capsys):
    """`compile -i`: report.json's cpu_cycles and report.html's table, for the core a CPU kernel runs on (the
    default Cortex-M55 beside an Ethos-U; the target itself for a Cortex-M)."""
    import json

    from tosakit.cli import main

    for target, core in (("ethos-u55-128", "cortex-m55"), ("cortex-m33", "cortex-m33")):
        folder = tmp_path / target
        folder.mkdir()
        assert main(["compile", "-m", "softmax", "-t", target, "-o", str(folder / "s.pte"), "-i", str(folder)]) == 0
        out = capsys.readouterr().out
        [report] = json.loads((folder / "report.json").read_text())["cpu_cycles"]
        assert report["core"] == core and report["total_cycles"] > 0 and not report["without_estimate"]
        assert [c["kernel"] for c in report["calls"]] == ["aten::_softmax.out"]
        assert f"CPU kernels of forward on {core}" in (folder / "report.html").read_text()
        assert f"CPU kernels of forward on {core}: {report['total_cycles']:,} cycles estimated" in out
