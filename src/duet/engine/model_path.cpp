#include "duet/engine/model_path.h"

#include <filesystem>

#include "duet/core/error.h"
#include "duet/formats/hf_folder.h"
#include "duet/tokenizer/hf_tokenizer.h"

namespace duet {

GgufFile open_model_path(const std::string& path, ConvertedCopies copies, bool with_mtp) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (!is_hf_folder(path)) {
      fail(ErrorCode::kNotFound, "'{}' is a folder without config.json: expected a GGUF file or a Hugging Face model "
           "folder", path);
    }
    return open_hf_folder(path, hf_tokenizer_metadata(path), copies, with_mtp);
  }
  return GgufFile::open(path);
}

}  // namespace duet
