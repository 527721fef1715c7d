// The `duet` subcommands. Each adds itself to the app and returns the callback's exit code
// through `exit_code`.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

namespace duet::cli {

void add_inspect_command(CLI::App& app, int& exit_code);
void add_devices_command(CLI::App& app, int& exit_code);
void add_tokenize_command(CLI::App& app, int& exit_code);
void add_make_model_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_logits_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_render_chat_command(CLI::App& app, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code);
void add_run_batch_command(CLI::App& app, int& exit_code);
void add_quantize_command(CLI::App& app, int& exit_code);
void add_kl_divergence_command(CLI::App& app, int& exit_code);

}  // namespace duet::cli
