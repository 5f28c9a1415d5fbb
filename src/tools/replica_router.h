#pragma once
// Data-parallel serving (docs/distributed.md): `tern serve --replicas N` starts N `tern serve`
// processes of the same model (each with its own threads, on its own loopback port) and answers
// the API on the front port by passing each request to one of them; `--replica URL` adds a
// server that runs elsewhere (another node). Routing: among the replicas that are up, the one
// that last served the same prompt prefix (its prefix cache holds it) unless it has more than
// `affinity_slack` requests in flight beyond the least-loaded one, else the least-loaded one.
// A replica that fails (its connection refused or broken, its process gone, its /health not
// answering) is marked down: a request not yet sent to it goes to another replica; one in
// flight on it ends with a clear error (502 before the answer began, an error event in a
// stream); no new request is routed to it until /health answers again. GET /router/status
// tells each replica's state, GET /metrics the router's counters per replica.
#include <string>
#include <vector>

namespace tern {

struct RouterConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  int replicas = 0;                   // local `tern serve` processes to start
  std::vector<std::string> remote;    // URLs of servers started elsewhere (http://HOST:PORT)
  std::vector<std::string> serve_args;  // the replicas' `tern serve` arguments (no --port/--host)
  int affinity_slack = 2;
  size_t prefix_bytes = 512;          // how much of a prompt keys the affinity
  double health_interval_s = 1.0;
  double startup_timeout_s = 300;     // for the local replicas' first /health
  std::string api_key;                // passed on to the replicas (they check it)
};

// Starts the replicas, serves until SIGINT / SIGTERM, stops them. `signals` (SIGINT, SIGTERM)
// are blocked in every thread already. Throws tern::Error when a replica does not start.
int run_replica_router(const RouterConfig& cfg);

// The `tern serve` arguments for a replica: `args` without --replicas, --replica, --port and
// --host (and their values, in any spelling: "--port 9", "--port=9").
std::vector<std::string> replica_serve_args(const std::vector<std::string>& args);

}  // namespace tern
