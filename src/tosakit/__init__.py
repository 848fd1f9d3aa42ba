"""tosakit: PyTorch to Arm Ethos-U and VGF through TOSA, as ExecuTorch .pte programs.

The flow, one package per stage: capture -> quantize -> partition -> lower (TOSA)
-> backends (ethosu, vgf, tosa) -> program (.pte) -> runtime -> verify. The public names
follow ExecuTorch's Arm backend, so its tutorial code runs with only the imports
changed.
"""

import logging as _logging
import warnings as _warnings

# torchao reports optional CUDA kernels it cannot load, and torch warns about an enum
# registration inside torchao and a pytree deprecation inside torch.export: none of
# them concerns a CPU-only Arm flow or anything the user can change.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
_warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*", category=FutureWarning)

from .lazy import lazy_exports  # noqa: E402

_EXPORTS = {
    ".backends.ethosu": ["EthosUPartitioner"],
    ".backends.vgf": ["VgfPartitioner"],
    ".errors": ["TosakitError"],
    ".lower": ["TOSAPartitioner"],
    ".partition": ["DontPartition", "DontPartitionModule", "DontPartitionName"],
    ".program": ["EdgeCompileConfig", "EdgeProgramManager", "ExecutorchBackendConfig", "ExecutorchProgramManager",
                 "to_backend", "to_edge", "to_edge_transform_and_lower", "save_pte_program"],
    ".quantize": ["EthosUQuantizer", "QuantizationConfig", "TOSAQuantizer", "VgfQuantizer",
                  "get_symmetric_a8w4_quantization_config", "get_symmetric_a16w8_quantization_config",
                  "get_symmetric_quantization_config"],
    ".specs": ["ArmCompileSpecBuilder", "EthosUCompileSpec", "TosaCompileSpec", "TosaSpecification",
               "VgfCompileSpec", "generate_ethosu_compile_spec", "generate_tosa_compile_spec",
               "generate_vgf_compile_spec"],
}
__getattr__, __dir__ = lazy_exports(__name__, {name: module for module, names in _EXPORTS.items() for name in names})


def ArmPartitioner(compile_spec, additional_checks=None):
    """The older partitioner name: picks the partitioner that matches ``compile_spec``."""
    from .backends.ethosu import EthosUPartitioner
    from .backends.vgf import VgfPartitioner
    from .lower import TOSAPartitioner
    from .specs import EthosUCompileSpec, VgfCompileSpec

    if isinstance(compile_spec, EthosUCompileSpec):
        return EthosUPartitioner(compile_spec, additional_checks)
    if isinstance(compile_spec, VgfCompileSpec):
        return VgfPartitioner(compile_spec, additional_checks)
    return TOSAPartitioner(compile_spec, additional_checks)


__version__ = "0.1.0"
__all__ = [
    "ArmCompileSpecBuilder",
    "ArmPartitioner",
    "DontPartition",
    "DontPartitionModule",
    "DontPartitionName",
    "EdgeCompileConfig",
    "EdgeProgramManager",
    "EthosUCompileSpec",
    "EthosUPartitioner",
    "EthosUQuantizer",
    "ExecutorchBackendConfig",
    "ExecutorchProgramManager",
    "QuantizationConfig",
    "TOSAPartitioner",
    "TOSAQuantizer",
    "TosaCompileSpec",
    "TosaSpecification",
    "TosakitError",
    "VgfCompileSpec",
    "VgfPartitioner",
    "VgfQuantizer",
    "generate_ethosu_compile_spec",
    "generate_tosa_compile_spec",
    "generate_vgf_compile_spec",
    "get_symmetric_a8w4_quantization_config",
    "get_symmetric_a16w8_quantization_config",
    "get_symmetric_quantization_config",
    "save_pte_program",
    "to_backend",
    "to_edge",
    "to_edge_transform_and_lower",
]
