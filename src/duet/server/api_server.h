// `duet serve`: the OpenAI-compatible HTTP API over the engine service. Listens first (so
// /health can say 503 while the model loads), loads the model, serves, and on SIGTERM/SIGINT
// stops admitting, lets in-flight requests finish up to the shutdown timeout, aborts the rest
// and returns 0.
#pragma once

#include <string>

#include "duet/server/server_config.h"

namespace duet::server {

// Blocks until a termination signal; returns the process exit code. Throws Error for a
// configuration that cannot start (bad address, port in use, unreadable model).
int run_server(const ServerConfig& config);

// `duet run-batch`: loads the models as run_server does and runs OpenAI's batch file format
// through the same request handler, with no socket (see batch_runner.h): `input` and `output` are
// paths, or "-" for stdin and stdout. Returns 0 when every request succeeded, 1 when any failed
// (their lines say why). Throws Error when a file cannot be opened or a model does not load.
int run_batch(const ServerConfig& config, const std::string& input, const std::string& output);

}  // namespace duet::server
