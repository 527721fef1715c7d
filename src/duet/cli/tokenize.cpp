// `duet tokenize --model FILE [--add-special] [--parse-special] TEXT`: prints token ids.
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/core/error.h"
#include "duet/engine/model_path.h"
#include "duet/formats/gguf.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string text_file;
  bool add_special = false;
  bool parse_special = false;
  bool show_pieces = false;
};

int run_tokenize(const TokenizeOptions& o) {
  std::string text = o.text;
  if (!o.text_file.empty()) {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in) fail(ErrorCode::kNotFound, "cannot read '{}'", o.text_file);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  const GgufFile file = open_model_path(o.model);
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(file);
  const std::vector<int32_t> ids = tok->encode(text, o.add_special, o.parse_special);
  if (o.show_pieces) {
    for (int32_t id : ids) fmt::print("{}\t{:?}\n", id, tok->token_to_piece(id, true));
  } else {
    fmt::print("{}\n", fmt::join(ids, " "));
  }
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  auto o = std::make_shared<TokenizeOptions>();
  cmd->add_option("-m,--model", o->model, "GGUF file or Hugging Face folder with a tokenizer")->required();
  auto* text = cmd->add_option("text", o->text, "Text to tokenize");
  auto* file = cmd->add_option("--text-file", o->text_file, "Read the text from a file");
  text->excludes(file);
  cmd->add_flag("--add-special", o->add_special, "Add BOS/EOS as the model's metadata says");
  cmd->add_flag("--parse-special", o->parse_special, "Turn the text of special tokens into their ids");
  cmd->add_flag("--show-pieces", o->show_pieces, "Print one id and its text per line");
  cmd->callback([o, &exit_code] { exit_code = run_tokenize(*o); });
}

}  // namespace duet::cli
