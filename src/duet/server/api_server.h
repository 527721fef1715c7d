// `duet serve`: the OpenAI-compatible HTTP API over the engine service. Listens first (so
// /health can say 503 while the model loads), loads the model, serves, and on SIGTERM/SIGINT
// stops admitting, lets in-flight requests finish up to the shutdown timeout, aborts the rest
// and returns 0.
#pragma once

#include "duet/server/server_config.h"

namespace duet::server {

// Blocks until a termination signal; returns the process exit code. Throws Error for a
// configuration that cannot start (bad address, port in use, unreadable model).
int run_server(const ServerConfig& config);

}  // namespace duet::server
