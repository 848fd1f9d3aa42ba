"""The NPU's operations, one executor per family; importing this package fills the operation table
(``npu.OPERATIONS``) and what each runs of Ethos-U85 streams (``npu.U85_RUNS``)."""

from . import convolution, dma, elementwise, pooling  # noqa: F401
