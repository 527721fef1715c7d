// The subcommands of `duet bench` beyond the default pp/tg measurement.
#pragma once

#include <CLI/CLI.hpp>

namespace duet::cli {

void add_bench_throughput_command(CLI::App* bench, int& exit_code);
void add_bench_serve_command(CLI::App* bench, int& exit_code);
void add_bench_bandwidth_command(CLI::App* bench, int& exit_code);
void add_bench_grammar_command(CLI::App* bench, int& exit_code);
void add_bench_allreduce_command(CLI::App* bench, int& exit_code);

}  // namespace duet::cli
