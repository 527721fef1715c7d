// Hugging Face config.json and generation_config.json (read_hf_config, add_hf_generation_config):
// any text is either refused with an Error or becomes GGUF keys of one of the architectures duet
// serves, all named under general.* or that architecture's prefix, which assemble into a GgufFile
// (the in-memory form a model folder takes).
#include <string>

#include "duet/core/error.h"
#include "duet/formats/gguf.h"
#include "duet/formats/hf_config.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;
  const std::string path = fuzz::write_scratch("config.json", fuzz::as_text(data, size));
  try {
    HfModelConfig c = read_hf_config(path, "fuzz");
    bool known = false;
    for (const char* arch : {"llama", "qwen2", "qwen3", "deepseek2", "deepseek32"}) {
      known = known || c.architecture == arch;
    }
    if (!known || c.num_layers <= 0) __builtin_trap();
    for (const auto& [key, value] : c.metadata) {
      if (!key.starts_with("general.") && !key.starts_with(c.architecture + ".")) __builtin_trap();
    }
    const GgufFile f = GgufFile::assemble(path, std::move(c.metadata), {}, {});
    if (f.get_string("general.architecture") != c.architecture) __builtin_trap();
  } catch (const Error&) {
  }
  try {
    GgufMetadata m;
    add_hf_generation_config(path, m);
    for (const auto& [key, value] : m) {
      if (!key.starts_with("duet.generation.")) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
