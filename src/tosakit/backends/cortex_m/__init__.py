"""The direct flow on a Cortex-M core: ExecuTorch's ``cortex_m::`` kernels (CMSIS-NN on the device) for the quantized
patterns they compute (``passes``), their schemas and integer semantics (``ops``), their scratch sizes
(``scratch``)."""
