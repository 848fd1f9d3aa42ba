"""Each NPU operation's estimate (``timing.Cost``) from the registers its command set: the MAC operations
(convolution, depthwise, pooling, U85's matrix product) block by block, elementwise operations per element, and
the bytes every operand, weight and scale stream moves, per memory."""

from __future__ import annotations

import math

import numpy as np

from .featuremap import FeatureMap
from .hardware import Accelerator
from .npu import Npu
from .system import MemorySystem
from .timing import Cost, Operand, Traffic, ceil_div, channel_bandwidth, output_cycles, round_up, volume


def _ofm_block(npu: Npu) -> tuple[int, int, int]:
    """The OFM block configuration the stream set (height, width, depth)."""
    return tuple(npu.value(f"OFM_BLK_{a}_M1", f"{a.lower()}_m1") + 1 for a in ("HEIGHT", "WIDTH", "DEPTH"))


def _ublock(npu: Npu, hw: Accelerator, kind: str, ofm, kernel_h: int) -> tuple[int, int, int]:
    """The OFM microblock the operation computes in."""
    if hw.u85:
        return hw.ublock(npu.name("ACC_FORMAT", "microblock"))
    u = hw.ublock()
    if u[0] == 2 and kind == "NPU_OP_CONV" and ofm[0] == 1 and ofm[1] % 2 == 0 and kernel_h == 1:
        return 1, 4, u[2]  # a two-row microblock machine computes a one-row OFM in 1x4 microblocks
    return u


def _ifm_block(npu: Npu, hw: Accelerator, depth_first: bool, ofm_block, k, ifm_bits: int, part_kernel: bool,
               ublock, upscale: str) -> tuple[int, int, int]:
    """The IFM block the OFM block reads (not a register: Vela's rule); ``depth_first``: an operation summing over
    the IFM's depth (convolution, REDUCE_SUM), whose IFM block has a depth of its own."""
    factor, rounding = (1, 0) if upscale.endswith("NONE") else (2, 1 if upscale.endswith("NEAREST") else 0)

    def extent(blk: int, stride: int, size: int, dilation: int) -> int:
        return ceil_div((blk - 1) * stride + min((size - 1) * dilation + 1, 8) + rounding, factor)

    unit = hw.ifm_ublock if hw.u85 else ublock  # U85 allocates IFM blocks in its IFM microblocks
    h = round_up(extent(ofm_block[0], k.sy, k.h, k.dy), unit[0])
    w = round_up(extent(ofm_block[1], k.sx, k.w, k.dx), unit[1])
    if not depth_first:
        return h, w, ofm_block[2]
    ic = npu.value("IFM_DEPTH_M1", "depth_m1") + 1
    if hw.u85:
        depth = 16 if part_kernel else 32 if ifm_bits == 32 or (hw.macs in (128, 256) and ublock[2] == 16) else 64
    elif ifm_bits == 8:
        depth = round_up(min(ic, 16 if part_kernel else 32), 8)
    else:
        depth = round_up(min(ic, 16), 4)
    return h, w, depth


def _sub_kernels(k) -> list[int]:
    """The elements of each piece of at most 8x8 the kernel is split into."""
    pieces = lambda n: [8] * (n // 8) + ([n % 8] if n % 8 else [])  # noqa: E731
    return [a * b for a in pieces(k.h) for b in pieces(k.w)]


def _mac_block_cycles(hw, kind, depth_first, nu, ifm_block_c, ifm_bits, part_kernel, acc_wide, k, ifm_c,
                      sparse: bool, weight_fetch: bool = True) -> int:
    """Cycles of the MAC stage for one OFM block (``nu``: microblocks per block along H, W, C, then the
    microblock's depth; ``sparse``: Ethos-U85 weights in the 2:4 sparse format, half the MAC steps); without
    ``weight_fetch`` the MACs' own work alone (not waiting for a microblock's weights): the cycles the MAC-active
    counter counts."""
    wb = 4 * nu[3] // (hw.cores if hw.u85 else 1) if weight_fetch else 0  # cycles to take in a microblock's weights
    d = (7 if acc_wide else 3) if hw.macs == 32 else (3 if acc_wide and hw.macs <= 128 else 2)
    total = 0
    for e in _sub_kernels(k):
        if kind == "NPU_OP_POOL" and not depth_first:
            steps = 1
            cycles = max(4, e) * nu[0] * nu[1] * nu[2] * (1 if hw.macs == 32 and not hw.u85 else ifm_bits // 2)
        elif kind == "NPU_OP_DEPTHWISE":
            steps = ceil_div(e, 4)
            cycles = max(wb, 4 * nu[0] * nu[1] * ifm_bits // 8) * steps * nu[2]
        elif part_kernel:
            steps = ceil_div(e, 2 if ifm_bits == 16 else 4)
            cycles = max(wb, 4 * nu[0] * nu[1]) * steps * nu[2] * ceil_div(ifm_block_c, 8) // (2 if sparse else 1)
        else:
            steps = e
            if hw.u85:
                cycles = max(wb, ifm_block_c // 8 * nu[0] * nu[1]) * e * nu[2] * ifm_bits // 8 // (2 if sparse else 1)
            else:
                cycles = max(wb, 4 * nu[0] * nu[1]) * e * nu[2]
        delay = 0
        if nu[0] * nu[1] == 1:
            delay = d * steps if nu[2] == 1 else d * (steps - 1) * nu[2] if steps > 1 else 0
        if part_kernel:
            delay *= ceil_div(ifm_block_c, 8)
        total += cycles + delay
    if depth_first:
        total *= ceil_div(ifm_c, ifm_block_c)
    return total if hw.u85 else total // hw.cores


MAC_KINDS = ("NPU_OP_CONV", "NPU_OP_DEPTHWISE", "NPU_OP_POOL")


def estimate(npu: Npu, command, hw: Accelerator, system: MemorySystem, chained_ao: float = 0.0) -> Cost:
    """The estimate of the operation ``command`` (run already: its registers are set); ``chained_ao``: the output
    cycles per element of the operations chained after it (Ethos-U85), which its output stage runs too."""
    kind = command.register.name
    if kind == "NPU_OP_POOL" and not hw.u85 and _moves_data(npu, _mode(command)):
        return _data_move(npu, hw, system)
    if kind in MAC_KINDS:
        return _mac_op(npu, command, hw, system, chained_ao)
    if kind in ("NPU_OP_ELEMENTWISE", "NPU_OP_RESIZE"):
        return _elementwise(npu, command, hw, system, chained_ao)
    return Cost()


def _moves_data(npu: Npu, mode: str) -> bool:
    """A 1x1 pooling to a depth-1 map: how Vela moves data on Ethos-U55/U65 (a TRANSPOSE, a strided copy), unless
    it is a REDUCE_SUM of a deeper IFM (a softmax's sum)."""
    k = npu.kernel()
    deeper = mode == "REDUCE_SUM" and npu.value("IFM_DEPTH_M1", "depth_m1") > 0
    return k.h == k.w == 1 and npu.value("OFM_DEPTH_M1", "depth_m1") == 0 and not deeper


def _data_move(npu: Npu, hw: Accelerator, system: MemorySystem) -> Cost:
    """A data move costs its memory traffic alone, as Vela costs the TRANSPOSE it makes of them: the slower of
    reading the IFM and writing the OFM, each with its latency, or the memories' access cycles."""
    shape = npu.ofm_shape()
    ifm = Operand.of(FeatureMap.of(npu.regs, "IFM"), shape, system)
    ofm = Operand.of(FeatureMap.of(npu.regs, "OFM"), shape, system)
    read, written = volume(shape) * ifm.bits // 8, volume(shape) * ofm.bits // 8
    compute = max(int(read / ifm.memory.bandwidth) + ifm.memory.read_latency,
                  int(written / ofm.memory.bandwidth) + ofm.memory.write_latency)
    traffic = Traffic(hw)
    traffic.add(ifm.memory, "ifm", read)
    # its OFM written element by element: bursts of 16 bytes a core
    traffic.add(ofm.memory, "write", written * ofm.memory.burst // min(ofm.memory.burst, 16 * hw.burst_cores))
    return Cost(compute, traffic=traffic)


def _mode(command) -> str:
    fields = [f for f in command.register.fields if f.enum]
    return fields[0].enum.get(command.field(fields[0].name), "").rsplit("_MODE_", 1)[-1] if fields else ""


def _mac_op(npu: Npu, command, hw: Accelerator, system: MemorySystem, chained_ao: float) -> Cost:
    kind, mode = command.register.name, _mode(command)
    matmul = hw.u85 and kind == "NPU_OP_CONV" and command.field("weights_ifm2")
    ofm_shape = npu.ofm_shape()
    k = npu.kernel()
    ifm_fm, ofm_fm = FeatureMap.of(npu.regs, "IFM"), FeatureMap.of(npu.regs, "OFM")
    depth_first = kind == "NPU_OP_CONV" or mode == "REDUCE_SUM"
    ifm_c = npu.value("IFM_DEPTH_M1", "depth_m1") + 1 if depth_first else ofm_shape[2]
    ih, iw = (ofm_shape[0], ofm_shape[1]) if matmul else k.ifm_extent(ofm_shape[0], ofm_shape[1])
    ifm = Operand.of(ifm_fm, (max(ih, 1), max(iw, 1), ifm_c), system)
    ofm = Operand.of(ofm_fm, ofm_shape, system)
    chained = npu.ofm_chained()
    part_kernel = npu.name("KERNEL_STRIDE", "weight_order").endswith("PART_KERNEL_FIRST") and kind == "NPU_OP_CONV"
    acc_wide = npu.name("ACC_FORMAT", "acc_format").endswith(("I40", "I48"))
    config = _ofm_block(npu)
    block = tuple(min(s, c) for s, c in zip(ofm_shape, config))
    ublock = _ublock(npu, hw, kind, ofm_shape, k.h)
    ifm_config = _ifm_block(npu, hw, depth_first, config, k, ifm.bits, part_kernel, ublock,
                            npu.name("IFM_UPSCALE", "mode"))
    ifm_block = tuple(min(s, c) for s, c in zip(ifm.shape, ifm_config))
    nu = tuple(ceil_div(b, u) for b, u in zip(block, ublock)) + (ublock[2],)
    sparse = hw.u85 and kind == "NPU_OP_CONV" and npu.name("WEIGHT_FORMAT", "weight_sparsity").endswith("2_4")
    stage = (hw, kind, depth_first, nu, ifm_block[2], ifm.bits, part_kernel, acc_wide, k, ifm.shape[2], sparse)
    mac_blk, busy = _mac_block_cycles(*stage), _mac_block_cycles(*stage, weight_fetch=False)
    blocks = volume(ceil_div(s, u) for s, u in zip(ofm_shape, ublock)) / volume(nu[:3])
    ao = output_cycles(hw, kind, mode, ifm.bits, ofm.bits, False, acc_wide, npu.name("ACTIVATION",
                       "activation_function"), chained, _transposed(npu))
    ao_blk = math.ceil((ao + chained_ao) * volume(block))
    weights = system.memory(npu.value("WEIGHT_REGION", "region"))
    if kind in ("NPU_OP_CONV", "NPU_OP_DEPTHWISE") and not matmul:
        ao_blk = max(ao_blk, 10 * block[2] * weights.read_latency // 256)
    ifm_cycles = ifm.block_cycles(ifm_config, False, hw.burst_cores)
    ofm_cycles = ofm.block_cycles(config, True, hw.burst_cores)
    delta = abs(ofm_cycles - ifm_cycles) if blocks > 1 else 0
    issue = (delta + mac_blk + ao_blk) / 4
    b_mac, b_ao = max(mac_blk, issue), max(ao_blk, issue)
    total = int(b_mac * blocks) + b_ao if b_mac > b_ao else b_ao * blocks + b_mac
    cost = Cost(int(total + ofm_cycles + ifm_cycles), int(busy * blocks), ao=ao)
    cost.macs = k.h * k.w * volume(ofm_shape) * (ifm_c if depth_first else 1) // (2 if sparse else 1)
    cost.traffic, cost.weight_decode = _mac_traffic(npu, hw, system, kind, matmul, ofm_shape, block, ifm, ofm,
                                                   ifm_config, ifm_block, config, k, chained, cost.macs)
    return cost


def _transposed(npu: Npu) -> bool:
    if not npu.u85:
        return False
    order = npu.name("OFM_PRECISION", "activation_transpose").rsplit("_", 1)[1]
    return order in ("WHC", "WCH", "CWH") or npu.name("OFM_PRECISION", "activation_reverse").endswith("_W")


def _stream_lengths(npu: Npu, hw: Accelerator) -> tuple[int, int]:
    """Bytes of the operation's weight streams (one per core) and its scale stream."""
    names = ["WEIGHT_LENGTH"] + [f"WEIGHT{i}_LENGTH" for i in range(1, hw.cores)]
    weights = sum(npu.value(n, "length") for n in names if f"NPU_SET_{n}" in npu.regs.by_name)
    return weights, npu.value("SCALE_LENGTH", "length")


def _mac_traffic(npu, hw, system, kind, matmul, ofm_shape, block, ifm, ofm, ifm_config, ifm_block, config, k,
                 chained, macs) -> tuple[Traffic, int]:
    """The bytes a MAC operation moves, and the weight decoder's cycles (U85)."""
    traffic = Traffic(hw)
    blocks = [ceil_div(s, b) for s, b in zip(ofm_shape, block)]
    if kind != "NPU_OP_CONV":  # depthwise and pooling: each block reads its own channels
        blocks[2] = 1
    sub = ceil_div(k.w, 8) * ceil_div(k.h, 8)
    fetch = ifm.stored_elements((ifm_block[0], ifm_block[1], ifm.shape[2]))
    ifm_read = fetch * sub * volume(blocks)
    traffic.add(ifm.memory, "ifm", ifm.effective_bytes(ifm_read, ifm_config, False, hw.burst_cores))
    if matmul:
        ifm2 = Operand.of(FeatureMap.of(npu.regs, "IFM2"), (ofm_shape[0], ofm_shape[2], ifm.shape[2]), system)
        traffic.add(ifm2.memory, "ifm_stream", ifm2.effective_bytes(ifm2.stored_elements(), ifm_config, False,
                                                                    hw.burst_cores))
    if not chained:
        traffic.add(ofm.memory, "write", ofm.effective_bytes(ofm.stored_elements(), config, True, hw.burst_cores))
    decode = 0
    if kind in ("NPU_OP_CONV", "NPU_OP_DEPTHWISE") and not matmul:
        refetch = blocks[0] * blocks[1]
        weights, scales = _stream_lengths(npu, hw)
        memory = system.memory(npu.value("WEIGHT_REGION", "region"))
        fast = npu.u85 and npu.name("WEIGHT_FORMAT", "weight_format").endswith("FWD")
        traffic.add(memory, "fast_weight" if fast else "weight", weights * refetch)
        traffic.add(system.memory(npu.value("SCALE_REGION", "region")), "scale", scales * refetch)
        if hw.u85:
            bandwidth = channel_bandwidth(hw, memory, "fast_weight" if fast else "weight")
            decode = refetch * max(_decode_cycles(npu.weights, fast, hw.cores),
                                   int(weights / bandwidth) + memory.read_latency)
    return traffic, decode


def _decode_cycles(values, fast: bool, cores: int) -> int:
    """Cycles the Ethos-U85 weight decoder takes for the operation's weights (``values``, as the simulator decoded
    them): the fast format 32 a cycle (64 with fewer than 16 distinct values); the default one 8 to 32 a cycle
    and core, faster the more of them are zero (Vela's figures)."""
    if values is None:
        return 0
    if fast:
        return values.size // (64 if _distinct(values) < 16 else 32)
    zeros = min(max(float(np.count_nonzero(values == 0)) / max(values.size, 1), 0.5), 0.9)
    return values.size // (int(8 + (zeros - 0.5) * 24 / 0.4) * cores)


def _elementwise(npu: Npu, command, hw: Accelerator, system: MemorySystem, chained_ao: float) -> Cost:
    kind, mode = command.register.name, _mode(command)
    ofm_shape = npu.ofm_shape()
    ifm_fm, ofm_fm = FeatureMap.of(npu.regs, "IFM"), FeatureMap.of(npu.regs, "OFM")
    ifm, ofm = Operand.of(ifm_fm, ofm_shape, system), Operand.of(ofm_fm, ofm_shape, system)
    binary = kind == "NPU_OP_ELEMENTWISE" and mode not in ("ABS", "CLZ", "LRELU")
    scalar = binary and _scalar_ifm2(npu)
    config = _ofm_block(npu)
    ao = output_cycles(hw, kind, mode, ifm.bits, ofm.bits, binary, False,
                       npu.name("ACTIVATION", "activation_function"), npu.ofm_chained(), _transposed(npu))
    elements = ofm.stored_elements()
    operands = [ifm]
    reads = [ifm.stored_elements() if hw.u85 else ifm.stored_elements(ofm_shape)]
    if binary and not scalar:
        ifm2_shape = _ifm2_shape(npu, ofm_shape)
        operands.append(Operand.of(FeatureMap.of(npu.regs, "IFM2"), ifm2_shape, system))
        # Ethos-U55/U65 read IFM2 over the OFM's extent too, but a one-element IFM2 once, rounded as IFM1 is stored
        reads.append(operands[-1].stored_elements() if hw.u85 else
                     ifm.stored_elements(ifm2_shape if volume(ifm2_shape) == 1 else ofm_shape))
    block_cycles = max(ofm.block_cycles(config, True, hw.burst_cores),
                       *(o.block_cycles(config, False, hw.burst_cores) for o in operands))
    per_element = (block_cycles / volume(config) + ao + chained_ao) / 4
    cost = Cost(max(math.ceil(per_element * elements), math.ceil((ao + chained_ao) * elements)), ao=ao)
    traffic = Traffic(hw)
    for o, count in zip(operands, reads):  # Ethos-U55/U65: over the OFM's extent, rounded as IFM1 is stored
        traffic.add(o.memory, "ifm_stream", o.effective_bytes(count, config, False, hw.burst_cores))
    if not npu.ofm_chained():
        traffic.add(ofm.memory, "write", ofm.effective_bytes(elements, config, True, hw.burst_cores))
    cost.traffic = traffic
    return cost


def _distinct(values) -> int:
    """How many distinct values ``values`` holds (a count per value in their range: no sort)."""
    flat = np.asarray(values, np.int64).ravel()
    if not flat.size:
        return 0
    low, high = int(flat.min()), int(flat.max())
    if high - low >= 1 << 20:
        return np.unique(flat).size
    return int(np.count_nonzero(np.bincount(flat - low)))


def _ifm2_shape(npu: Npu, ofm_shape) -> tuple[int, int, int]:
    """IFM2's own shape: the OFM's, with each axis it is broadcast along one element long."""
    if npu.u85:
        axes = npu.name("IFM2_BROADCAST", "broadcast_mode").removeprefix("BROADCAST_MODE_")
        along = set(axes) if axes not in ("NONE", "SCALAR", "") else set()
    else:
        along = {a.upper() for a in "hwc" if npu.name("IFM2_BROADCAST", f"broadcast_{a}").endswith("ENABLE")}
    return tuple(1 if axis in along else n for axis, n in zip("HWC", ofm_shape))


def _scalar_ifm2(npu: Npu) -> bool:
    if npu.u85:
        return npu.name("IFM2_BROADCAST", "broadcast_mode").endswith("SCALAR")
    return npu.name("IFM2_BROADCAST", "broadcast_constant").endswith("ENABLE")
