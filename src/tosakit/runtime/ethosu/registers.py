"""The Ethos-U command registers as data: one table per architecture (Ethos-U55 and U65 share one, Ethos-U85
has its own), read by the decoder, the disassembler and the simulator.

A command is one 32-bit word (cmd0: a 16-bit code and a 16-bit parameter) or two (cmd1: the same, then a
32-bit data word). Names of registers, fields and enum values are regor's, as Vela's
``--verbose-register-command-stream`` listing prints them (regor's Ethos-U65 interface header, which it uses
for U55 and U65 alike, and its Ethos-U85 header). The two tables share most codes, but not all meanings:
U85 gives 0x4025/0x4026 (U55's OPA/OPB_SCALE) to IFM/IFM2_SCALE, 0x012D (U55's AB_START) to RESIZE_Y_OFFSET,
0x4033/0x4034 (DMA0_SKIP0/1) to DMA0_SRC_STRIDE0/1 and 0x4092/0x4093 (SCALE1) to WEIGHT2, and renumbers
enums (activation_function 4 is SIGMOID on U55, LUT_S8_S8 on U85).

Bit positions (``Field.lsb``) count in the command's *value*: the 16-bit parameter for cmd0; for cmd1,
``(param << 32) | data``, so the data word is bits 0..31 and the parameter bits 32..47. An address, 32 bits
of data extended by the low 8 bits of the parameter (a 40-bit address), is then one field."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import TosakitError, did_you_mean
from ...targets import ETHOSU_TARGETS

CMD1 = 0x4000  # the control bits (14..15) of a command code: 1 = cmd1, a data word follows


@dataclass(frozen=True)
class Field:
    """A bit field of a command's value (see the module docstring for where bits count from)."""

    name: str
    lsb: int
    width: int
    enum: dict[int, str] | None = None  # value -> regor's enum name
    signed: bool = False  # a two's complement number of ``width`` bits

    def __hash__(self) -> int:  # the enum dict is not hashable; a field is known by its place
        return hash((self.name, self.lsb, self.width))


@dataclass(frozen=True)
class Register:
    """A command: its 16-bit code as regor's listing prints it, its name, and its fields in listing order."""

    code: int
    name: str
    fields: tuple[Field, ...]

    @property
    def has_payload(self) -> bool:
        """cmd1: a 32-bit data word follows the command word."""
        return bool(self.code & CMD1)


def _enum(prefix: str, *members: str, **sparse: int) -> dict[int, str]:
    """Values numbered from 0 in order (``members``) or given (``sparse``), named ``PREFIX_MEMBER``."""
    values = {**{i: m for i, m in enumerate(members)}, **{v: m for m, v in sparse.items()}}
    return {v: f"{prefix}_{m}" for v, m in sorted(values.items())}


_U55_ENUMS: dict[str, dict[int, str]] = {
    "acc_format": _enum("ACC_FORMAT", "I32", "I40", "F16"),
    "activation_clip_range": _enum("ACTIVATION_CLIP_RANGE", OFM_PRECISION=0, FORCE_UINT8=2, FORCE_INT8=3,
                                   FORCE_INT16=5),
    "activation_format": _enum("ACTIVATION_FORMAT", "NHWC", "NHCWB16"),
    "activation_function": _enum("ACTIVATION_FUNCTION", RELU=0, TANH=3, SIGMOID=4,
                                 **{f"TABLE_{i}": 16 + i for i in range(8)}),
    "activation_precision": _enum("ACTIVATION_PRECISION", "B8", "B16", "B32", "B64"),
    "activation_type": _enum("ACTIVATION_TYPE", "UNSIGNED", "SIGNED"),
    "broadcast_mode": _enum("BROADCAST_MODE", "DISABLE", "ENABLE"),
    "dma_region_mode": _enum("DMA_REGION_MODE", "EXTERNAL", "INTERNAL"),
    "dma_stride_mode": _enum("DMA_STRIDE_MODE", "D1", "D2", "D3"),
    "elementwise_mode": _enum("ELEMENTWISE_MODE", "MUL", "ADD", "SUB", "MIN", "MAX", "LRELU", "ABS", "CLZ", "SHR",
                              "SHL"),
    "ifm2_operand_order": _enum("IFM2_OPERAND_ORDER", "ORDER_B", "ORDER_A"),
    "ifm_scale_mode": _enum("IFM_SCALE_MODE", "OPA_OPB_16", "OPA_32", "OPB_32"),
    "ifm_upscale_mode": _enum("IFM_UPSCALE_MODE", "NONE", "NEAREST", "ZEROS"),
    "kernel_decomposition": _enum("KERNEL_DECOMPOSITION", "D8X8", "D4X4"),
    "kernel_dilation": _enum("KERNEL_DILATION", "NONE", "X2"),
    "ofm_scale_mode": _enum("OFM_SCALE_MODE", "PER_CHANNEL", "GLOBAL"),
    "parallel_mode": _enum("PARALLEL_MODE", "SINGLE_CORE", "DUAL_CORE_DEPTH"),
    "pooling_mode": _enum("POOLING_MODE", "MAX", "AVERAGE", "REDUCE_SUM"),
    "round_mode": _enum("ROUND_MODE", "DBL", "TRUNCATE", "NATURAL"),
    "weight_order": _enum("WEIGHT_ORDER", "DEPTH_FIRST", "PART_KERNEL_FIRST"),
}

# Fields shared by many registers: (name, lsb, width[, enum]).
_ADDR = (("addr", 0, 40),)
_PAD7, _PAD8 = (("pad", 0, 7),), (("pad", 0, 8),)
_W16, _H16, _D16 = (("width_m1", 0, 16),), (("height_m1", 0, 16),), (("depth_m1", 0, 16),)
_REGION = (("region", 0, 3),)
_ZERO_POINT = (("zero_point", 0, 16),)
_CLIP = (("clip_boundary", 0, 16),)
_SIZE = (("size", 0, 16),)
_SCALE_SHIFT = (("shift", 32, 6), ("scale", 0, 32))
_DMA_REGION = (("region", 0, 3), ("region_mode", 8, 1, "dma_region_mode"), ("stride_mode", 9, 2, "dma_stride_mode"))
_IFM_PRECISION = (("activation_type", 0, 1, "activation_type"), ("activation_precision", 2, 2, "activation_precision"),
                  ("activation_format", 6, 2, "activation_format"))

# code, name, fields — the commands Ethos-U55/U65 and Ethos-U85 share, fields and all.
_COMMON_TABLE = (
    (0x0000, "NPU_OP_STOP", (("mask", 0, 16),)),
    (0x0001, "NPU_OP_IRQ", (("mask", 0, 16),)),
    (0x0003, "NPU_OP_DEPTHWISE", ()),
    (0x0005, "NPU_OP_POOL", (("pooling_mode", 0, 3, "pooling_mode"),)),
    (0x0006, "NPU_OP_ELEMENTWISE", (("elementwise_mode", 0, 6, "elementwise_mode"),)),
    (0x0010, "NPU_OP_DMA_START", ()),
    (0x0013, "NPU_OP_PMU_MASK", (("enable", 0, 1),)),
    (0x0100, "NPU_SET_IFM_PAD_TOP", _PAD7),
    (0x0101, "NPU_SET_IFM_PAD_LEFT", _PAD7),
    (0x0102, "NPU_SET_IFM_PAD_RIGHT", _PAD8),
    (0x0103, "NPU_SET_IFM_PAD_BOTTOM", _PAD8),
    (0x0104, "NPU_SET_IFM_DEPTH_M1", _D16),
    (0x0107, "NPU_SET_IFM_UPSCALE", (("mode", 0, 2, "ifm_upscale_mode"),)),
    (0x0109, "NPU_SET_IFM_ZERO_POINT", _ZERO_POINT),
    (0x010A, "NPU_SET_IFM_WIDTH0_M1", _W16),
    (0x010B, "NPU_SET_IFM_HEIGHT0_M1", _H16),
    (0x010C, "NPU_SET_IFM_HEIGHT1_M1", _H16),
    (0x010F, "NPU_SET_IFM_REGION", _REGION),
    (0x0111, "NPU_SET_OFM_WIDTH_M1", _W16),
    (0x0112, "NPU_SET_OFM_HEIGHT_M1", _H16),
    (0x0113, "NPU_SET_OFM_DEPTH_M1", _D16),
    (0x0118, "NPU_SET_OFM_ZERO_POINT", _ZERO_POINT),
    (0x011A, "NPU_SET_OFM_WIDTH0_M1", _W16),
    (0x011B, "NPU_SET_OFM_HEIGHT0_M1", _H16),
    (0x011C, "NPU_SET_OFM_HEIGHT1_M1", _H16),
    (0x011F, "NPU_SET_OFM_REGION", _REGION),
    (0x0120, "NPU_SET_KERNEL_WIDTH_M1", _W16),
    (0x0121, "NPU_SET_KERNEL_HEIGHT_M1", _H16),
    (0x0122, "NPU_SET_KERNEL_STRIDE", (("stride_x_lsb", 0, 1), ("stride_y_lsb", 1, 1),
                                       ("weight_order", 2, 1, "weight_order"), ("dilation_x", 3, 1, "kernel_dilation"),
                                       ("dilation_y", 4, 1, "kernel_dilation"),
                                       ("decomposition", 5, 1, "kernel_decomposition"),
                                       ("stride_x_msb", 6, 1), ("stride_y_msb", 9, 1))),
    (0x0126, "NPU_SET_ACTIVATION_MIN", _CLIP),
    (0x0127, "NPU_SET_ACTIVATION_MAX", _CLIP),
    (0x0128, "NPU_SET_WEIGHT_REGION", _REGION),
    (0x0129, "NPU_SET_SCALE_REGION", _REGION),
    (0x0132, "NPU_SET_DMA0_SIZE0", _SIZE),
    (0x0133, "NPU_SET_DMA0_SIZE1", _SIZE),
    (0x0189, "NPU_SET_IFM2_ZERO_POINT", _ZERO_POINT),
    (0x018A, "NPU_SET_IFM2_WIDTH0_M1", _W16),
    (0x018B, "NPU_SET_IFM2_HEIGHT0_M1", _H16),
    (0x018C, "NPU_SET_IFM2_HEIGHT1_M1", _H16),
    (0x018F, "NPU_SET_IFM2_REGION", _REGION),
    (0x4000, "NPU_SET_IFM_BASE0", _ADDR),
    (0x4001, "NPU_SET_IFM_BASE1", _ADDR),
    (0x4002, "NPU_SET_IFM_BASE2", _ADDR),
    (0x4003, "NPU_SET_IFM_BASE3", _ADDR),
    (0x4004, "NPU_SET_IFM_STRIDE_X", _ADDR),
    (0x4005, "NPU_SET_IFM_STRIDE_Y", _ADDR),
    (0x4006, "NPU_SET_IFM_STRIDE_C", _ADDR),
    (0x4010, "NPU_SET_OFM_BASE0", _ADDR),
    (0x4011, "NPU_SET_OFM_BASE1", _ADDR),
    (0x4012, "NPU_SET_OFM_BASE2", _ADDR),
    (0x4013, "NPU_SET_OFM_BASE3", _ADDR),
    (0x4014, "NPU_SET_OFM_STRIDE_X", _ADDR),
    (0x4015, "NPU_SET_OFM_STRIDE_Y", _ADDR),
    (0x4016, "NPU_SET_OFM_STRIDE_C", _ADDR),
    (0x4020, "NPU_SET_WEIGHT_BASE", _ADDR),
    (0x4021, "NPU_SET_WEIGHT_LENGTH", (("length", 0, 32),)),
    (0x4022, "NPU_SET_SCALE_BASE", _ADDR),
    (0x4023, "NPU_SET_SCALE_LENGTH", (("length", 0, 20),)),
    (0x4030, "NPU_SET_DMA0_SRC", _ADDR),
    (0x4031, "NPU_SET_DMA0_DST", _ADDR),
    (0x4032, "NPU_SET_DMA0_LEN", _ADDR),  # a length, named "addr" by regor
    (0x4080, "NPU_SET_IFM2_BASE0", _ADDR),
    (0x4081, "NPU_SET_IFM2_BASE1", _ADDR),
    (0x4082, "NPU_SET_IFM2_BASE2", _ADDR),
    (0x4083, "NPU_SET_IFM2_BASE3", _ADDR),
    (0x4084, "NPU_SET_IFM2_STRIDE_X", _ADDR),
    (0x4085, "NPU_SET_IFM2_STRIDE_Y", _ADDR),
    (0x4086, "NPU_SET_IFM2_STRIDE_C", _ADDR),
    (0x4090, "NPU_SET_WEIGHT1_BASE", _ADDR),
    (0x4091, "NPU_SET_WEIGHT1_LENGTH", (("length", 0, 32),)),
)

# code, name, fields — Ethos-U55 and U65's own commands.
_U55_TABLE = (
    (0x0002, "NPU_OP_CONV", ()),
    (0x0011, "NPU_OP_DMA_WAIT", (("k", 0, 1),)),
    (0x0012, "NPU_OP_KERNEL_WAIT", (("n", 0, 2),)),
    (0x0105, "NPU_SET_IFM_PRECISION", (*_IFM_PRECISION, ("scale_mode", 8, 2, "ifm_scale_mode"),
                                       ("round_mode", 14, 2, "round_mode"))),
    (0x010D, "NPU_SET_IFM_IB_END", (("ib_end", 0, 6),)),
    (0x0114, "NPU_SET_OFM_PRECISION", (("activation_type", 0, 1, "activation_type"),
                                       ("activation_precision", 1, 2, "activation_precision"),
                                       ("activation_format", 6, 2, "activation_format"),
                                       ("scale_mode", 8, 1, "ofm_scale_mode"), ("round_mode", 14, 2, "round_mode"))),
    (0x0115, "NPU_SET_OFM_BLK_WIDTH_M1", (("width_m1", 0, 6),)),
    (0x0116, "NPU_SET_OFM_BLK_HEIGHT_M1", (("height_m1", 0, 5),)),
    (0x0117, "NPU_SET_OFM_BLK_DEPTH_M1", (("depth_m1", 0, 7),)),
    (0x0123, "NPU_SET_PARALLEL_MODE", (("parallel_mode", 0, 1, "parallel_mode"),)),
    (0x0124, "NPU_SET_ACC_FORMAT", (("acc_format", 0, 2, "acc_format"),)),
    (0x0125, "NPU_SET_ACTIVATION", (("activation_function", 0, 5, "activation_function"),
                                    ("activation_clip_range", 12, 3, "activation_clip_range"))),
    (0x012D, "NPU_SET_AB_START", (("ab_start", 0, 6),)),
    (0x012F, "NPU_SET_BLOCKDEP", (("blockdep", 0, 2),)),
    (0x0130, "NPU_SET_DMA0_SRC_REGION", _DMA_REGION),
    (0x0131, "NPU_SET_DMA0_DST_REGION", _DMA_REGION),
    (0x0180, "NPU_SET_IFM2_BROADCAST", (("broadcast_h", 0, 1, "broadcast_mode"), ("broadcast_w", 1, 1, "broadcast_mode"),
                                        ("broadcast_c", 2, 1, "broadcast_mode"),
                                        ("operand_order", 6, 1, "ifm2_operand_order"),
                                        ("broadcast_constant", 7, 1, "broadcast_mode"))),
    (0x0181, "NPU_SET_IFM2_SCALAR", (("scalar", 0, 16),)),
    (0x0185, "NPU_SET_IFM2_PRECISION", _IFM_PRECISION),
    (0x018D, "NPU_SET_IFM2_IB_START", (("ib_start", 0, 6),)),
    (0x4024, "NPU_SET_OFM_SCALE", _SCALE_SHIFT),
    (0x4025, "NPU_SET_OPA_SCALE", _SCALE_SHIFT),
    (0x4026, "NPU_SET_OPB_SCALE", (("scale", 0, 16),)),
    (0x4033, "NPU_SET_DMA0_SKIP0", _ADDR),
    (0x4034, "NPU_SET_DMA0_SKIP1", _ADDR),
    (0x4092, "NPU_SET_SCALE1_BASE", _ADDR),
    (0x4093, "NPU_SET_SCALE1_LENGTH", (("length", 0, 20),)),
)


_U85_ENUMS: dict[str, dict[int, str]] = {
    **{k: _U55_ENUMS[k] for k in ("activation_format", "activation_precision", "activation_type", "dma_region_mode",
                                  "dma_stride_mode", "ifm_upscale_mode", "kernel_decomposition", "kernel_dilation",
                                  "ofm_scale_mode", "weight_order")},
    "acc_format": _enum("ACC_FORMAT", "I32", "I48"),
    "acc_input": _enum("ACC_INPUT", "RESET", "KEEP", "IFM2"),
    "acc_output": _enum("ACC_OUTPUT", "ENABLE", "DISABLE"),
    "activation_clip_range": _enum("ACTIVATION_CLIP_RANGE", "B16", "NONE"),
    "activation_function": _enum("ACTIVATION_FUNCTION", LUT_NONE=0, LUT_U8_U8=1, LUT_S8_S8=4, LUT_S8_S16=5,
                                 LUT_S8_S32=7, LUT_S16_S16=8, LUT_S16_S32=9, LUT_TANH=10, LUT_SIGMOID=11),
    "activation_reverse": _enum("ACTIVATION_REVERSE", "NONE", "H", "W", "C"),
    "activation_storage": _enum("ACTIVATION_STORAGE", "TILE2X2", "TILE3X1", "CHAINED", "NONE"),
    "activation_transpose": _enum("ACTIVATION_TRANSPOSE", HWC=0, WHC=1, HCW=2, WCH=3, CHW=6, CWH=7),
    "branch_cond": _enum("BRANCH_COND", "ALWAYS", "RF_TRUE"),
    "broadcast_mode": _enum("BROADCAST_MODE", "NONE", "H", "W", "HW", "C", "CH", "CW", "CWH", "SCALAR"),
    "dma_idx_mode": _enum("DMA_IDX_MODE", "DISABLED", "ENABLED"),
    "elementwise_mode": _enum("ELEMENTWISE_MODE", "MUL", "ADD", "SUB", "MIN", "MAX", "LRELU", "ABS", "CLZ", "SHR",
                              "SHL", "LSR", "DIV", CMP_EQ=16, CMP_NE=17, CMP_GE=18, CMP_GT=19, AND=33, OR=34, XOR=35,
                              NOT=36, AND_NOT=42),
    "microblock": _enum("MICROBLOCK", "U1X1", "U1X2", "U1X4", "U2X2", "U2X4", "U4X4"),
    "pooling_mode": _enum("POOLING_MODE", "MAX", "AVERAGE", "REDUCE_SUM", "SUM", "NONE", "MIN", "ARGMAX_X",
                          "ARGMAX_Y"),
    "resize_mode": _enum("RESIZE_MODE", "BILINEAR", "REPLICATE", "NEAREST"),
    "round_mode_ifm": _enum("ROUND_MODE_IFM", "DOUBLE_SYMMETRIC", "NATURAL"),
    "round_mode_ofm": _enum("ROUND_MODE_OFM", "DOUBLE_SYMMETRIC", "NATURAL", "DOUBLE_ASYMMETRIC", "SYMMETRIC",
                            "TRUNCATE_TO_ZERO", "TRUNCATE_TO_LOWER"),
    "weight_format": _enum("WEIGHT_FORMAT", "SWD", "FWD"),
    "weight_sparsity": _enum("WEIGHT_SPARSITY", "NONE", "SPARSE_2_4"),
}
_SIGNED = "signed"  # a field's fifth element: a two's complement number

# code, name, fields — Ethos-U85's own commands (its layout where a shared code differs).
_U85_TABLE = (
    (0x0002, "NPU_OP_CONV", (("weights_ifm2", 0, 1),)),
    (0x0007, "NPU_OP_RESIZE", (("resize_mode", 0, 2, "resize_mode"),)),
    (0x0011, "NPU_OP_DMA_WAIT", (("k", 0, 2),)),
    (0x0012, "NPU_OP_KERNEL_WAIT", (("n", 0, 1),)),
    (0x0105, "NPU_SET_IFM_PRECISION", (("activation_type", 0, 1, "activation_type"),
                                       ("activation_precision", 2, 2, "activation_precision"),
                                       ("activation_format", 6, 2, "activation_format"),
                                       ("activation_storage", 14, 2, "activation_storage"))),
    (0x0108, "NPU_SET_IFM_BROADCAST", (("broadcast_mode", 0, 4, "broadcast_mode"),)),
    (0x0114, "NPU_SET_OFM_PRECISION", (("activation_type", 0, 1, "activation_type"),
                                       ("activation_precision", 1, 2, "activation_precision"),
                                       ("activation_format", 6, 2, "activation_format"),
                                       ("scale_mode", 8, 1, "ofm_scale_mode"),
                                       ("activation_reverse", 9, 2, "activation_reverse"),
                                       ("activation_transpose", 11, 3, "activation_transpose"),
                                       ("activation_storage", 14, 2, "activation_storage"))),
    (0x0115, "NPU_SET_OFM_BLK_WIDTH_M1", (("width_m1", 0, 7),)),
    (0x0116, "NPU_SET_OFM_BLK_HEIGHT_M1", (("height_m1", 0, 7),)),
    (0x0117, "NPU_SET_OFM_BLK_DEPTH_M1", (("depth_m1", 0, 10),)),
    (0x0124, "NPU_SET_ACC_FORMAT", (("acc_format", 0, 2, "acc_format"), ("acc_input", 4, 2, "acc_input"),
                                    ("acc_output", 6, 1, "acc_output"), ("microblock", 8, 3, "microblock"))),
    (0x0125, "NPU_SET_ACTIVATION", (("activation_function", 0, 5, "activation_function"), ("table", 5, 3),
                                    ("activation_clip_range", 12, 1, "activation_clip_range"))),
    (0x012A, "NPU_SET_RESIZE_X_SCALE_N_M1", (("resize_x_scale_n_m1", 0, 11),)),
    (0x012B, "NPU_SET_RESIZE_Y_SCALE_N_M1", (("resize_y_scale_n_m1", 0, 11),)),
    (0x012C, "NPU_SET_RESIZE_X_OFFSET", (("resize_x_offset", 0, 12, None, _SIGNED),)),
    (0x012D, "NPU_SET_RESIZE_Y_OFFSET", (("resize_y_offset", 0, 12, None, _SIGNED),)),
    (0x012E, "NPU_SET_WEIGHT_FORMAT", (("weight_format", 0, 1, "weight_format"),
                                       ("weight_sparsity", 4, 1, "weight_sparsity"))),
    (0x012F, "NPU_SET_BLOCKDEP", (("blockdep", 0, 3),)),
    (0x0130, "NPU_SET_DMA0_SRC_REGION", (("region", 0, 3), ("region_mode", 8, 1, "dma_region_mode"),
                                         ("stride_mode", 9, 2, "dma_stride_mode"), ("idx_mode", 11, 1, "dma_idx_mode"))),
    (0x0131, "NPU_SET_DMA0_DST_REGION", (("region", 0, 3), ("region_mode", 8, 1, "dma_region_mode"),
                                         ("idx_mode", 11, 1, "dma_idx_mode"))),
    (0x0134, "NPU_SET_DMA0_IDX_REGION", _REGION),
    (0x0180, "NPU_SET_IFM2_BROADCAST", (("broadcast_mode", 0, 4, "broadcast_mode"),)),
    (0x0185, "NPU_SET_IFM2_PRECISION", (("activation_type", 0, 1, "activation_type"),
                                        ("activation_precision", 2, 2, "activation_precision"),
                                        ("activation_format", 6, 2, "activation_format"),
                                        ("activation_storage", 14, 2, "activation_storage"))),
    (0x4024, "NPU_SET_OFM_SCALE", (("shift", 32, 6), ("dbl_rnd", 38, 5), ("round_mode", 45, 3, "round_mode_ofm"),
                                   ("scale", 0, 31))),
    (0x4025, "NPU_SET_IFM_SCALE", (("shift", 32, 6), ("dbl_rnd", 38, 5), ("round_mode", 45, 1, "round_mode_ifm"),
                                   ("scale", 0, 31))),
    (0x4026, "NPU_SET_IFM2_SCALE", (("shift", 32, 6), ("dbl_rnd", 38, 5), ("round_mode", 45, 1, "round_mode_ifm"),
                                    ("scale", 0, 31))),
    (0x4027, "NPU_SET_OP_SCALAR", (("scalar", 0, 32, None, _SIGNED),)),
    (0x4033, "NPU_SET_DMA0_SRC_STRIDE0", _ADDR),
    (0x4034, "NPU_SET_DMA0_SRC_STRIDE1", _ADDR),
    (0x4035, "NPU_SET_DMA0_DST_STRIDE0", _ADDR),
    (0x4036, "NPU_SET_DMA0_DST_STRIDE1", _ADDR),
    (0x4037, "NPU_SET_DMA0_IDX", _ADDR),
    (0x4038, "NPU_SET_DMA0_IDX_MAX", (("idx_max", 0, 31),)),
    (0x4039, "NPU_SET_DMA0_IDX_SKIP1", _ADDR),
    (0x4092, "NPU_SET_WEIGHT2_BASE", _ADDR),
    (0x4093, "NPU_SET_WEIGHT2_LENGTH", (("length", 0, 32),)),
    (0x4094, "NPU_SET_WEIGHT3_BASE", _ADDR),
    (0x4095, "NPU_SET_WEIGHT3_LENGTH", (("length", 0, 32),)),
    (0x4096, "NPU_SET_RESIZE_X_STEP", (("one_step_int", 32, 4), ("blk_step_int", 36, 11), ("one_step_mod", 0, 11),
                                       ("blk_step_mod", 16, 11))),
    (0x4097, "NPU_SET_RESIZE_Y_STEP", (("one_step_int", 32, 4), ("blk_step_int", 36, 11), ("one_step_mod", 0, 11),
                                       ("blk_step_mod", 16, 11))),
    (0x4100, "NPU_OP_BRANCH", (("branch_cond", 32, 1, "branch_cond"), ("branch_target", 0, 32))),
)


@dataclass(frozen=True)
class Lut:
    """An activation's lookup table in LUT memory: one little-endian entry of ``entry_bytes`` per step of the input
    (a signed ``bits``-bit value, saturated to that range) shifted right by ``fraction_bits``. Without fraction bits
    the entry's ``value`` is the result; with them the entry holds a ``base`` and the ``slope`` to the next entry's
    base, and the result is base + (slope x fraction + half) >> fraction_bits (the input's low bits)."""

    bits: int
    entry_bytes: int
    fields: tuple[Field, ...]
    fraction_bits: int = 0

    @property
    def size(self) -> int:
        """Bytes the table takes in LUT memory."""
        return self.entry_bytes << (self.bits - self.fraction_bits)


LUT8 = Lut(8, 1, (Field("value", 0, 8, signed=True),))
# regor writes a TOSA int16 TABLE's 513 entries as 512 words: entry i, and entry i + 1 less entry i.
LUT16 = Lut(16, 4, (Field("base", 0, 16, signed=True), Field("slope", 16, 16, signed=True)), fraction_bits=7)
# The LUT an activation function reads: Ethos-U55/U65's TABLE_k by the OFM precision's bits (an int16 OFM whose
# clip range is FORCE_INT8 reads an 8-bit one), Ethos-U85's by the function.
U55_LUTS = {8: LUT8, 16: LUT16}
U85_LUTS = {"ACTIVATION_FUNCTION_LUT_S8_S8": LUT8, "ACTIVATION_FUNCTION_LUT_S16_S16": LUT16}


def _field(enums: dict, name: str, lsb: int, width: int, enum: str | None = None, signed: str = "") -> Field:
    return Field(name, lsb, width, enums[enum] if enum else None, signed == _SIGNED)


def _map(table, enums: dict) -> dict[int, Register]:
    return {code: Register(code, name, tuple(_field(enums, *f) for f in fields)) for code, name, fields in table}


U55: dict[int, Register] = _map(_COMMON_TABLE + _U55_TABLE, _U55_ENUMS)  # Ethos-U55 and Ethos-U65
U85: dict[int, Register] = _map(_COMMON_TABLE + _U85_TABLE, _U85_ENUMS)

_MAPS = {"u55": U55, "u65": U55, "u85": U85}


def register_map(accelerator: str) -> dict[int, Register]:
    """The command registers of ``accelerator`` ("ethos-u55-128", "ethos-u65-256", ...), by code."""
    target = accelerator.strip().lower()
    if target not in ETHOSU_TARGETS:
        raise TosakitError(f"unknown Ethos-U accelerator {accelerator!r}", did_you_mean(target, ETHOSU_TARGETS))
    return _MAPS[ETHOSU_TARGETS[target].family]
