"""The Ethos-U command registers as data: one table per architecture, read by the decoder, the disassembler
and the simulator.

A command is one 32-bit word (cmd0: a 16-bit code and a 16-bit parameter) or two (cmd1: the same, then a
32-bit data word). Names of registers, fields and enum values are regor's, as Vela's
``--verbose-register-command-stream`` listing prints them (the Ethos-U65 interface header, which regor uses
for U55 and U65 alike).

Bit positions (``Field.lsb``) count in the command's *value*: the 16-bit parameter for cmd0; for cmd1,
``(param << 32) | data``, so the data word is bits 0..31 and the parameter bits 32..47. An address, 32 bits
of data extended by the low 8 bits of the parameter (a 40-bit address), is then one field."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import TosakitError, did_you_mean
from ...specs import ETHOSU_TARGETS, npu_family

CMD1 = 0x4000  # the control bits (14..15) of a command code: 1 = cmd1, a data word follows


@dataclass(frozen=True)
class Field:
    """A bit field of a command's value (see the module docstring for where bits count from)."""

    name: str
    lsb: int
    width: int
    enum: dict[int, str] | None = None  # value -> regor's enum name

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


ENUMS: dict[str, dict[int, str]] = {
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

# code, name, fields — every cmd0 and cmd1 command of Ethos-U55 and U65.
_U55_TABLE = (
    (0x0000, "NPU_OP_STOP", (("mask", 0, 16),)),
    (0x0001, "NPU_OP_IRQ", (("mask", 0, 16),)),
    (0x0002, "NPU_OP_CONV", ()),
    (0x0003, "NPU_OP_DEPTHWISE", ()),
    (0x0005, "NPU_OP_POOL", (("pooling_mode", 0, 3, "pooling_mode"),)),
    (0x0006, "NPU_OP_ELEMENTWISE", (("elementwise_mode", 0, 6, "elementwise_mode"),)),
    (0x0010, "NPU_OP_DMA_START", ()),
    (0x0011, "NPU_OP_DMA_WAIT", (("k", 0, 1),)),
    (0x0012, "NPU_OP_KERNEL_WAIT", (("n", 0, 2),)),
    (0x0013, "NPU_OP_PMU_MASK", (("enable", 0, 1),)),
    (0x0100, "NPU_SET_IFM_PAD_TOP", _PAD7),
    (0x0101, "NPU_SET_IFM_PAD_LEFT", _PAD7),
    (0x0102, "NPU_SET_IFM_PAD_RIGHT", _PAD8),
    (0x0103, "NPU_SET_IFM_PAD_BOTTOM", _PAD8),
    (0x0104, "NPU_SET_IFM_DEPTH_M1", _D16),
    (0x0105, "NPU_SET_IFM_PRECISION", (*_IFM_PRECISION, ("scale_mode", 8, 2, "ifm_scale_mode"),
                                       ("round_mode", 14, 2, "round_mode"))),
    (0x0107, "NPU_SET_IFM_UPSCALE", (("mode", 0, 2, "ifm_upscale_mode"),)),
    (0x0109, "NPU_SET_IFM_ZERO_POINT", _ZERO_POINT),
    (0x010A, "NPU_SET_IFM_WIDTH0_M1", _W16),
    (0x010B, "NPU_SET_IFM_HEIGHT0_M1", _H16),
    (0x010C, "NPU_SET_IFM_HEIGHT1_M1", _H16),
    (0x010D, "NPU_SET_IFM_IB_END", (("ib_end", 0, 6),)),
    (0x010F, "NPU_SET_IFM_REGION", _REGION),
    (0x0111, "NPU_SET_OFM_WIDTH_M1", _W16),
    (0x0112, "NPU_SET_OFM_HEIGHT_M1", _H16),
    (0x0113, "NPU_SET_OFM_DEPTH_M1", _D16),
    (0x0114, "NPU_SET_OFM_PRECISION", (("activation_type", 0, 1, "activation_type"),
                                       ("activation_precision", 1, 2, "activation_precision"),
                                       ("activation_format", 6, 2, "activation_format"),
                                       ("scale_mode", 8, 1, "ofm_scale_mode"), ("round_mode", 14, 2, "round_mode"))),
    (0x0115, "NPU_SET_OFM_BLK_WIDTH_M1", (("width_m1", 0, 6),)),
    (0x0116, "NPU_SET_OFM_BLK_HEIGHT_M1", (("height_m1", 0, 5),)),
    (0x0117, "NPU_SET_OFM_BLK_DEPTH_M1", (("depth_m1", 0, 7),)),
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
    (0x0123, "NPU_SET_PARALLEL_MODE", (("parallel_mode", 0, 1, "parallel_mode"),)),
    (0x0124, "NPU_SET_ACC_FORMAT", (("acc_format", 0, 2, "acc_format"),)),
    (0x0125, "NPU_SET_ACTIVATION", (("activation_function", 0, 5, "activation_function"),
                                    ("activation_clip_range", 12, 3, "activation_clip_range"))),
    (0x0126, "NPU_SET_ACTIVATION_MIN", _CLIP),
    (0x0127, "NPU_SET_ACTIVATION_MAX", _CLIP),
    (0x0128, "NPU_SET_WEIGHT_REGION", _REGION),
    (0x0129, "NPU_SET_SCALE_REGION", _REGION),
    (0x012D, "NPU_SET_AB_START", (("ab_start", 0, 6),)),
    (0x012F, "NPU_SET_BLOCKDEP", (("blockdep", 0, 2),)),
    (0x0130, "NPU_SET_DMA0_SRC_REGION", _DMA_REGION),
    (0x0131, "NPU_SET_DMA0_DST_REGION", _DMA_REGION),
    (0x0132, "NPU_SET_DMA0_SIZE0", _SIZE),
    (0x0133, "NPU_SET_DMA0_SIZE1", _SIZE),
    (0x0180, "NPU_SET_IFM2_BROADCAST", (("broadcast_h", 0, 1, "broadcast_mode"), ("broadcast_w", 1, 1, "broadcast_mode"),
                                        ("broadcast_c", 2, 1, "broadcast_mode"),
                                        ("operand_order", 6, 1, "ifm2_operand_order"),
                                        ("broadcast_constant", 7, 1, "broadcast_mode"))),
    (0x0181, "NPU_SET_IFM2_SCALAR", (("scalar", 0, 16),)),
    (0x0185, "NPU_SET_IFM2_PRECISION", _IFM_PRECISION),
    (0x0189, "NPU_SET_IFM2_ZERO_POINT", _ZERO_POINT),
    (0x018A, "NPU_SET_IFM2_WIDTH0_M1", _W16),
    (0x018B, "NPU_SET_IFM2_HEIGHT0_M1", _H16),
    (0x018C, "NPU_SET_IFM2_HEIGHT1_M1", _H16),
    (0x018D, "NPU_SET_IFM2_IB_START", (("ib_start", 0, 6),)),
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
    (0x4024, "NPU_SET_OFM_SCALE", _SCALE_SHIFT),
    (0x4025, "NPU_SET_OPA_SCALE", _SCALE_SHIFT),
    (0x4026, "NPU_SET_OPB_SCALE", (("scale", 0, 16),)),
    (0x4030, "NPU_SET_DMA0_SRC", _ADDR),
    (0x4031, "NPU_SET_DMA0_DST", _ADDR),
    (0x4032, "NPU_SET_DMA0_LEN", _ADDR),  # a length, named "addr" by regor
    (0x4033, "NPU_SET_DMA0_SKIP0", _ADDR),
    (0x4034, "NPU_SET_DMA0_SKIP1", _ADDR),
    (0x4080, "NPU_SET_IFM2_BASE0", _ADDR),
    (0x4081, "NPU_SET_IFM2_BASE1", _ADDR),
    (0x4082, "NPU_SET_IFM2_BASE2", _ADDR),
    (0x4083, "NPU_SET_IFM2_BASE3", _ADDR),
    (0x4084, "NPU_SET_IFM2_STRIDE_X", _ADDR),
    (0x4085, "NPU_SET_IFM2_STRIDE_Y", _ADDR),
    (0x4086, "NPU_SET_IFM2_STRIDE_C", _ADDR),
    (0x4090, "NPU_SET_WEIGHT1_BASE", _ADDR),
    (0x4091, "NPU_SET_WEIGHT1_LENGTH", (("length", 0, 32),)),
    (0x4092, "NPU_SET_SCALE1_BASE", _ADDR),
    (0x4093, "NPU_SET_SCALE1_LENGTH", (("length", 0, 20),)),
)


def _field(name: str, lsb: int, width: int, enum: str | None = None) -> Field:
    return Field(name, lsb, width, ENUMS[enum] if enum else None)


def _map(table) -> dict[int, Register]:
    return {code: Register(code, name, tuple(_field(*f) for f in fields)) for code, name, fields in table}


U55: dict[int, Register] = _map(_U55_TABLE)  # Ethos-U55 and Ethos-U65

_MAPS = {"ethos-u55": U55, "ethos-u65": U55}


def register_map(accelerator: str) -> dict[int, Register]:
    """The command registers of ``accelerator`` ("ethos-u55-128", "ethos-u65-256", ...), by code."""
    target = accelerator.strip().lower()
    if target not in ETHOSU_TARGETS:
        raise TosakitError(f"unknown Ethos-U accelerator {accelerator!r}", did_you_mean(target, ETHOSU_TARGETS))
    family = npu_family(target)
    if family not in _MAPS:
        raise TosakitError(f"{accelerator} command streams are not decoded yet: only Ethos-U55 and U65 are",
                           "inspect or simulate an ethos-u55 or ethos-u65 program")
    return _MAPS[family]
