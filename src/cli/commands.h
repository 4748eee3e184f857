// The subcommands of `flotilla`, one file each; main.cc wires them into CLI11.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "common/common.h"

namespace flotilla::cli {

// Exit codes shared by the commands: 0 clean, 1 drain timed out, 2 bad arguments or input,
// 3 cannot listen.
constexpr int kExitDrainTimeout = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitCannotListen = 3;

// Adds `flotilla gateway` (and `flotilla gateway mint-token`) to `app`; the returned callable
// runs whichever was parsed.
std::function<int()> add_gateway_command(CLI::App& app);

// Adds `flotilla controller` (Kubernetes mode); the returned callable runs it.
std::function<int()> add_controller_command(CLI::App& app);

// Adds `flotilla sim`; the returned callable runs it.
std::function<int()> add_sim_command(CLI::App& app);

// Adds `flotilla up`; the returned callable runs it.
std::function<int()> add_up_command(CLI::App& app);

// Adds the control-plane client commands (deploy, ls, get, predict, rm, tokens, events); the
// returned callable runs whichever was parsed, or returns -1 when none was.
std::function<int()> add_client_commands(CLI::App& app);

// Adds `flotilla pull` and `flotilla artifact pack`; the returned callable runs whichever was
// parsed, or returns -1 when none was.
std::function<int()> add_artifact_commands(CLI::App& app);

// "host:port" → host and port; kInvalidArgument naming the text otherwise.
Result<std::pair<std::string, uint16_t>> split_address(const std::string& address);

}  // namespace flotilla::cli
