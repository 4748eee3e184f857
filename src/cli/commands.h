// The subcommands of `flotilla`, one file each; main.cc wires them into CLI11.
#pragma once

#include <CLI/CLI.hpp>

namespace flotilla::cli {

// Exit codes shared by the commands: 0 clean, 1 drain timed out, 2 bad arguments or input,
// 3 cannot listen.
constexpr int kExitDrainTimeout = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitCannotListen = 3;

// Adds `flotilla gateway` (and `flotilla gateway mint-token`) to `app`; the returned callable
// runs whichever was parsed.
std::function<int()> add_gateway_command(CLI::App& app);

// Adds `flotilla sim`; the returned callable runs it.
std::function<int()> add_sim_command(CLI::App& app);

}  // namespace flotilla::cli
