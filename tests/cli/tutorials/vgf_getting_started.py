# The VGF "Getting Started Tutorial" code from ExecuTorch's docs (shared/seeds), with only
# the import lines changed from executorch.* to tosakit. tests/cli/test_tutorials.py runs it.
import torch

class AddSigmoid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sigmoid = torch.nn.Sigmoid()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.sigmoid(x + y)

example_inputs = (torch.ones(1,1,1,1),torch.ones(1,1,1,1))

model = AddSigmoid()
model = model.eval()
exported_program = torch.export.export(model, example_inputs)
graph_module = exported_program.graph_module


from tosakit import (
    VgfQuantizer,
    get_symmetric_quantization_config,
)
from tosakit import VgfCompileSpec
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

compile_spec = VgfCompileSpec()
quantizer = VgfQuantizer(compile_spec)
operator_config = get_symmetric_quantization_config(is_per_channel=False)
quantizer.set_global(operator_config)
quantizer.set_module_type(torch.nn.Sigmoid, None)
quantized_graph_module = prepare_pt2e(graph_module, quantizer)
quantized_graph_module(*example_inputs)
quantized_graph_module = convert_pt2e(quantized_graph_module)
quantized_exported_program = torch.export.export(quantized_graph_module, example_inputs)

import os
from tosakit import VgfPartitioner
from tosakit import (
    EdgeCompileConfig,
    ExecutorchBackendConfig,
    to_edge_transform_and_lower,
)
from tosakit import save_pte_program

partitioner = VgfPartitioner(compile_spec)
edge_program_manager = to_edge_transform_and_lower(
        quantized_exported_program,
        partitioner=[partitioner],
        compile_config=EdgeCompileConfig(
            _check_ir_validity=False,
        ),
    )
executorch_program_manager = edge_program_manager.to_executorch(
        config=ExecutorchBackendConfig(extract_delegate_segments=False)
    )
cwd_dir = os.getcwd()
pte_base_name = "simple_example"
pte_name = pte_base_name + ".pte"
pte_path = os.path.join(cwd_dir, pte_name)
save_pte_program(executorch_program_manager, pte_name)
assert os.path.exists(pte_path), "Build failed; no .pte-file found"
