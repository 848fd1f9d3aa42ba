// Loads and runs one method of a .pte with ExecuTorch's C++ runtime the way arm_executor_runner lays out its
// pools, and prints as JSON what each pool was asked for: the method allocator's allocations per stage (planned
// arenas, load_method, the inputs' EValue list), the temp allocator's peak at load and at execute, and the
// sizes of the runtime types tosakit's figures are built from.
//
// usage: memory_runner PROGRAM.pte METHOD_POOL_BYTES TEMP_POOL_BYTES
#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

using namespace executorch::runtime;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::extension::FileDataLoader;

namespace {

// A bump allocator that remembers every request it served and its highest use.
class CountingAllocator : public MemoryAllocator {
 public:
  CountingAllocator(uint32_t size, uint8_t* base) : MemoryAllocator(size, base) {}
  void* allocate(size_t size, size_t alignment) override {
    void* p = MemoryAllocator::allocate(size, alignment);
    if (p != nullptr) {
      log += (log.empty() ? "" : ",") + std::string("[") + std::to_string(size) + "," +
          std::to_string(alignment) + "]";
      if (used_size() > peak) peak = used_size();
    }
    return p;
  }
  std::string log;
  size_t peak = 0;
};

uint8_t* pool(size_t size) {
  size_t rounded = (size + 15) / 16 * 16;
  return static_cast<uint8_t*>(std::aligned_alloc(16, rounded ? rounded : 16));
}

int fail(const char* stage, Error err, const CountingAllocator& method) {
  std::printf("{\"error\": %u, \"stage\": \"%s\", \"method_used\": %zu}\n", static_cast<unsigned>(err), stage,
              method.used_size());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s PROGRAM.pte METHOD_POOL_BYTES TEMP_POOL_BYTES\n", argv[0]);
    return 2;
  }
  runtime_init();
  size_t method_pool = std::strtoull(argv[2], nullptr, 10), temp_pool = std::strtoull(argv[3], nullptr, 10);
  CountingAllocator method(method_pool, pool(method_pool));
  CountingAllocator temp(temp_pool, temp_pool ? pool(temp_pool) : nullptr);

  Result<FileDataLoader> loader = FileDataLoader::from(argv[1]);
  if (!loader.ok()) return fail("open", loader.error(), method);
  Result<Program> program = Program::load(&loader.get(), Program::Verification::InternalConsistency);
  if (!program.ok()) return fail("load_program", program.error(), method);
  const char* name = *program->get_method_name(0);
  Result<MethodMeta> meta = program->method_meta(name);
  if (!meta.ok()) return fail("method_meta", meta.error(), method);

  // arm_executor_runner: each planned arena from the method pool, 16-byte aligned
  std::vector<Span<uint8_t>> spans;
  for (size_t id = 0; id < meta->num_memory_planned_buffers(); ++id) {
    size_t size = static_cast<size_t>(meta->memory_planned_buffer_size(id).get());
    uint8_t* buffer = size ? static_cast<uint8_t*>(method.allocate(size, 16)) : nullptr;
    if (size && buffer == nullptr) return fail("arenas", Error::MemoryAllocationFailed, method);
    spans.emplace_back(buffer, size);
  }
  size_t arenas = method.used_size();
  std::string arena_log = method.log;
  method.log.clear();
  HierarchicalAllocator planned({spans.data(), spans.size()});
  MemoryManager manager(&method, &planned, &temp);

  Result<Method> loaded = program->load_method(name, &manager);
  if (!loaded.ok()) return fail("load_method", loaded.error(), method);
  size_t after_load = method.used_size();
  size_t temp_at_load = temp.peak;
  std::string load_log = method.log;
  method.log.clear();
  temp.peak = 0;

  // arm_executor_runner's prepare_input_tensors: the inputs' EValue list, then each tensor input given a buffer
  size_t n_inputs = loaded->inputs_size();
  EValue* inputs = method.allocateList<EValue>(n_inputs);
  if (n_inputs && inputs == nullptr) return fail("inputs", Error::MemoryAllocationFailed, method);
  Error err = loaded->get_inputs(inputs, n_inputs);
  if (err != Error::Ok) return fail("get_inputs", err, method);
  std::vector<std::vector<uint8_t>> buffers;
  for (size_t i = 0; i < n_inputs; ++i) {
    if (!inputs[i].isTensor()) continue;
    Result<TensorInfo> info = meta->input_tensor_meta(i);
    buffers.emplace_back(info->nbytes(), 0);
    TensorImpl impl(info->scalar_type(), static_cast<ssize_t>(info->sizes().size()),
                    const_cast<TensorImpl::SizesType*>(info->sizes().data()), buffers.back().data(),
                    const_cast<TensorImpl::DimOrderType*>(info->dim_order().data()));
    err = loaded->set_input(Tensor(&impl), i);
    if (err != Error::Ok) return fail("set_input", err, method);
  }
  size_t after_inputs = method.used_size();
  method.log.clear();

  err = loaded->execute();
  if (err != Error::Ok) return fail("execute", err, method);

  std::printf(
      "{\"arenas\": %zu, \"load_method\": %zu, \"inputs\": %zu, \"execute\": %zu, "
      "\"temp_at_load\": %zu, \"temp_at_execute\": %zu, "
      "\"arena_allocations\": [%s], \"load_allocations\": [%s], \"execute_allocations\": [%s], "
      "\"sizeof\": {\"EValue\": %zu, \"TensorImpl\": %zu, \"Tensor\": %zu, \"TensorMeta\": %zu, "
      "\"CompileSpec\": %zu, \"FreeableBuffer\": %zu, \"BoxedEvalueList<int64_t>\": %zu, "
      "\"ArrayRef<double>\": %zu, \"Span<EValue*>\": %zu, \"OpFunction\": %zu, \"optional<Tensor>\": %zu, "
      "\"pointer\": %zu}}\n",
      arenas, after_load - arenas, after_inputs - after_load, method.used_size() - after_inputs, temp_at_load,
      temp.peak, arena_log.c_str(), load_log.c_str(), method.log.c_str(), sizeof(EValue), sizeof(TensorImpl),
      sizeof(Tensor), sizeof(TensorMeta), sizeof(CompileSpec), sizeof(FreeableBuffer),
      sizeof(BoxedEvalueList<int64_t>), sizeof(executorch::aten::ArrayRef<double>), sizeof(Span<EValue*>),
      sizeof(OpFunction), sizeof(std::optional<Tensor>), sizeof(void*));
  return 0;
}
