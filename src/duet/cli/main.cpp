// duet: serves DeepSeek-family models. This is the command-line entry point; every error is
// caught here and printed as one line naming what was wrong.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/comm/mpi.h"
#include "duet/core/error.h"
#include "duet/core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"duet: a serving engine for DeepSeek-family language models"};
  app.set_version_flag("--version", std::string("duet ") + DUET_VERSION);
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  int exit_code = 0;
  duet::cli::add_inspect_command(app, exit_code);
  duet::cli::add_devices_command(app, exit_code);
  duet::cli::add_tokenize_command(app, exit_code);
  duet::cli::add_make_model_command(app, exit_code);
  duet::cli::add_generate_command(app, exit_code);
  duet::cli::add_logits_command(app, exit_code);
  duet::cli::add_bench_command(app, exit_code);
  duet::cli::add_render_chat_command(app, exit_code);
  duet::cli::add_serve_command(app, exit_code);
  duet::cli::add_run_batch_command(app, exit_code);
  duet::cli::add_quantize_command(app, exit_code);
  duet::cli::add_kl_divergence_command(app, exit_code);
  app.parse_complete_callback([&] { duet::configure_logging(log_level); });
  // Under mpirun a rank that fails ends the whole job (mpirun then exits non-zero), so no rank is
  // left waiting for it; a rank that finishes finalizes MPI.
  const auto failed = [] {
    std::fflush(stdout);
    std::fflush(stderr);
    duet::mpi_abort(1);
    return 1;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    if (rc != 0) return failed();
    duet::mpi_finalize();
    return rc;
  } catch (const duet::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "duet: error ({}): {}\n", duet::error_code_name(e.code()), e.what());
    return failed();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "duet: error: {}\n", e.what());
    return failed();
  }
  if (exit_code != 0) return failed();
  duet::mpi_finalize();
  return exit_code;
}
