"""Stage 6: lower partitions into delegates and write the ExecuTorch program (.pte).

The entry points keep ExecuTorch's names: ``to_edge_transform_and_lower``,
``EdgeProgramManager.to_executorch``, ``ExecutorchProgramManager.write_to_file``,
``save_pte_program``. The file format (``schema``, ``pte``) imports no torch.
"""

from ..lazy import lazy_exports

_MANAGER = ["EdgeCompileConfig", "ExecutorchBackendConfig", "LoweredBackendModule", "EdgeProgramManager",
            "ExecutorchProgramManager", "to_backend", "to_edge", "to_edge_transform_and_lower", "save_pte_program"]
_BUNDLED = ["BundledProgram", "MethodTestCase", "MethodTestSuite", "serialize_from_bundled_program_to_flatbuffer",
            "deserialize_from_flatbuffer_to_bundled_program"]
__all__ = [*_MANAGER, *_BUNDLED, "serialize_pte", "deserialize_pte", "tosa_key"]
__getattr__, __dir__ = lazy_exports(__name__, {**{n: ".manager" for n in _MANAGER}, **{n: ".bundled" for n in _BUNDLED},
                                               "serialize_pte": ".pte", "deserialize_pte": ".pte", "tosa_key": ".pte"})
