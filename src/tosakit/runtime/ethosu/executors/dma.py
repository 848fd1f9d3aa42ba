"""DMA: copies between memory regions (weights streamed from flash, LUTs into internal memory), and on U85
2-D and 3-D copies, rows gathered or scattered through an index array."""

from __future__ import annotations

import numpy as np

from ....errors import CORRUPT_STREAM_HINT, RUN_TOSA_HINT, IndexRangeError, TosakitError
from ..npu import LUT_BYTES, Npu, UnsupportedCommandError, check_work, operation


@operation("NPU_OP_DMA_START")
def dma(npu: Npu, command) -> None:
    """A copy between regions (weights streamed from flash, LUTs into internal memory); on U85 also 2-D and 3-D
    copies, rows gathered or scattered through an index array."""
    src_region, dst_region = npu.value("DMA0_SRC_REGION", "region"), npu.value("DMA0_DST_REGION", "region")
    src, dst, length = npu.value("DMA0_SRC", "addr"), npu.value("DMA0_DST", "addr"), npu.value("DMA0_LEN", "addr")  # regor names the length "addr"
    check_work(length, npu.memory.where)
    linear = npu.name("DMA0_SRC_REGION", "stride_mode") in ("", "DMA_STRIDE_MODE_D1")
    indexed = npu.u85 and any(npu.name(f"DMA0_{end}_REGION", "idx_mode").endswith("ENABLED") for end in ("SRC", "DST"))
    if npu.name("DMA0_DST_REGION", "region_mode").endswith("INTERNAL"):
        if not linear or indexed:
            raise UnsupportedCommandError(f"{npu.memory.where}: a strided or indexed DMA into internal memory is not "
                                          "simulated", RUN_TOSA_HINT)
        if dst < npu.shram.size - LUT_BYTES or dst + length > npu.shram.size:
            raise TosakitError(f"{npu.memory.where} writes internal bytes [{dst:#x}, {dst + length:#x}), outside "
                               f"its LUT area [{npu.shram.size - LUT_BYTES:#x}, {npu.shram.size:#x})",
                               CORRUPT_STREAM_HINT)
        npu.shram[dst: dst + length] = np.frombuffer(npu.memory.read_bytes(src_region, src, length), np.uint8)
        at = dst - (npu.shram.size - LUT_BYTES)
        npu.lut_written[at: at + length] = True
    elif linear and not indexed:
        npu.memory.copy(src_region, src, dst_region, dst, length)
    elif npu.u85:
        _rows_dma(npu, (src_region, src), (dst_region, dst), length)
    else:
        raise UnsupportedCommandError(f"{npu.memory.where}: 2-D and 3-D DMA are not simulated yet on the Ethos-U55/U65",
                                      RUN_TOSA_HINT)


def _rows_dma(npu: Npu, source: tuple[int, int], dest: tuple[int, int], length: int) -> None:
    """U85 2-D/3-D DMA: SIZE1 blocks of SIZE0 rows of LEN bytes, each end stepping by its STRIDE0 per row and its
    STRIDE1 per block; with an index array (int32, read in order, IDX_SKIP1 more bytes skipped per block) the
    indexed end's row is the index (a gather reads, a scatter writes, row idx; an index above IDX_MAX is an error)."""
    mode = npu.name("DMA0_SRC_REGION", "stride_mode")
    size0 = 1 if mode.endswith("D1") else npu.value("DMA0_SIZE0", "size")
    size1 = npu.value("DMA0_SIZE1", "size") if mode.endswith("D3") else 1
    check_work(size0 * size1 * length, npu.memory.where)
    npu.memory.check_extent(dest[0], (size1, size0, length), 1, "writes")  # before any address array is made
    block, row = np.arange(size1, dtype=np.int64)[:, None], np.arange(size0, dtype=np.int64)[None, :]
    rows = {"SRC": row, "DST": row}
    for end in rows:
        if npu.name(f"DMA0_{end}_REGION", "idx_mode").endswith("ENABLED"):
            skip = npu.value("DMA0_IDX_SKIP1", "addr") if mode.endswith("D3") else 0
            at = npu.value("DMA0_IDX", "addr") + 4 * (block * size0 + row) + block * skip
            index = npu.memory.read(npu.value("DMA0_IDX_REGION", "region"), at, np.int32)
            bound = npu.value("DMA0_IDX_MAX", "idx_max")
            if index.size and (index.min() < 0 or index.max() > bound):
                bad = int(index[(index < 0) | (index > bound)][0])
                raise IndexRangeError(f"{npu.memory.where} {'gathers' if end == 'SRC' else 'scatters'} row {bad}, "
                                      f"outside 0..{bound} (IDX_MAX)",
                                      "the program's indices are out of range for the tensor", bad, int(bound))
            rows[end] = index

    def addresses(end: str, start: int) -> np.ndarray:
        step0, step1 = (npu.value(f"DMA0_{end}_STRIDE{i}", "addr") for i in (0, 1))
        first = start + block * (step1 if size1 > 1 else 0) + rows[end] * step0
        return first[:, :, None] + np.arange(length, dtype=np.int64)

    values = npu.memory.read(source[0], addresses("SRC", source[1]), np.uint8)
    npu.memory.write(dest[0], addresses("DST", dest[1]), values, np.uint8)
