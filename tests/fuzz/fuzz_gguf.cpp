// GGUF files: the reader (header, metadata, tensor table) and, for files it accepts, every typed
// getter on every key, the tensors' shapes, and the tokenizer built from the metadata.
#include "duet/core/error.h"
#include "duet/formats/gguf.h"
#include "duet/tokenizer/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;
  const std::string path = fuzz::write_scratch("model.gguf", fuzz::as_text(data, size));
  try {
    const GgufFile file = GgufFile::open(path);
    for (const auto& [key, value] : file.metadata()) {
      (void)value.to_string();
      try {
        if (value.is_integer()) (void)file.get_int(key);
        if (value.is_float()) (void)file.get_float(key);
        if (value.type == GgufType::kString) (void)file.get_string(key);
        if (value.type == GgufType::kArray) {
          (void)file.get_string_array(key);
        }
      } catch (const Error&) {
      }
    }
    for (const GgufTensorInfo& t : file.tensors()) {
      (void)t.shape_string();
      (void)t.num_elements();
      if (t.nbytes > 0 && t.data != nullptr) {
        volatile uint8_t sink = t.data[0] ^ t.data[t.nbytes - 1];  // the data lies within the file
        (void)sink;
      }
    }
    const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(file);
    const std::vector<int32_t> ids = tokenizer->encode("Hello, world! 123 <｜end▁of▁sentence｜>", true, true);
    (void)tokenizer->decode(ids);
  } catch (const Error&) {
  }
  return 0;
}
