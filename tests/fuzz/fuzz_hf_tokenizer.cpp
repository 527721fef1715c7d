#include "fuzz_hf_tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/formats/gguf.h"
#include "duet/formats/hf_config.h"
#include "duet/tokenizer/chat_template.h"
#include "duet/tokenizer/hf_tokenizer.h"
#include "duet/tokenizer/hf_tokenizer_writer.h"
#include "duet/tokenizer/tokenizer.h"
#include "fuzz_common.h"

namespace duet::fuzz {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The valid files, written once; each input starts again from them.
struct ValidFolder {
  std::string dir;
  std::string tokenizer_json, tokenizer_config_json;
  ValidFolder() {
    dir = scratch_dir() + "/hf";
    std::filesystem::create_directories(dir);
    write_hf_tokenizer(tiny_vocab_file(), dir);
    tokenizer_json = read_all(dir + "/tokenizer.json");
    tokenizer_config_json = read_all(dir + "/tokenizer_config.json");
    // How the corpus' first seeds were made: DUET_FUZZ_SEED_OUT=FOLDER copies the valid files there.
    if (const char* out = std::getenv("DUET_FUZZ_SEED_OUT"); out != nullptr) {
      std::filesystem::copy_file(dir + "/tokenizer.json", std::string(out) + "/tokenizer.json",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::copy_file(dir + "/tokenizer_config.json", std::string(out) + "/tokenizer_config.json",
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }
};

}  // namespace

void run_hf_tokenizer(const std::string& file_name, const uint8_t* data, size_t size) {
  static const ValidFolder valid;
  write_scratch("hf/tokenizer.json", valid.tokenizer_json);
  write_scratch("hf/tokenizer_config.json", valid.tokenizer_config_json);
  write_scratch("hf/" + file_name, as_text(data, size));
  try {
    GgufMetadata metadata = hf_tokenizer_metadata(valid.dir);
    metadata.emplace_back("general.architecture", GgufValue::str("llama"));
    const GgufFile file = GgufFile::assemble("fuzzed tokenizer", std::move(metadata), {}, {});
    const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(file);
    const std::vector<int32_t> ids = tokenizer->encode("Hello, world! 123 \xe4\xbd\xa0\xe5\xa5\xbd", true, true);
    (void)tokenizer->decode(ids, true);
    if (const GgufValue* source = file.find("tokenizer.chat_template");
        source != nullptr && source->type == GgufType::kString) {
      const ChatTemplate t = ChatTemplate::parse(std::get<std::string>(source->value));
      const nlohmann::json messages = nlohmann::json::parse(
          R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2+2?"}])");
      (void)t.render(messages, {{"add_generation_prompt", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"}});
    }
  } catch (const Error&) {
  }
}

}  // namespace duet::fuzz
