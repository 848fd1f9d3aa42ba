"""Stage 8: the checkers that rebuild the compile to judge it — the program against PyTorch per output and per
layer (``run``, ``layers``), each NPU operation against the TOSA tensor it computes (``npu_ops``, from Vela's
operation map). They run programs with ``runtime`` and lower delegates again with ``lower``.

The modules are imported on first use: the sandbox's child imports ``npu_ops`` without torch."""
