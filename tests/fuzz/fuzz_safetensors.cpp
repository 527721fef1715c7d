// safetensors files: the header's JSON, dtypes, shapes and offsets against the file's size.
#include "duet/core/error.h"
#include "duet/formats/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;
  const std::string path = fuzz::write_scratch("model.safetensors", fuzz::as_text(data, size));
  try {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const SafetensorsTensor& t : file.tensors()) {
      (void)t.shape_string();
      (void)t.num_elements();
      if (t.nbytes > 0) {
        volatile uint8_t sink = t.data[0] ^ t.data[t.nbytes - 1];  // the data lies within the file
        (void)sink;
      }
      if (file.find(t.name) == nullptr) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
