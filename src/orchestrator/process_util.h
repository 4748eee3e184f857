// Process plumbing for the local orchestrator: spawning, identifying processes across restarts,
// exit descriptions, log tails, free ports and cgroup v2 limits. Private to the module.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/common.h"

namespace flotilla::orchestrator {

// Starts `argv` (argv[0] the executable path) with stdout and stderr appended to `log_path`,
// stdin from `stdin_fd` (-1: /dev/null), no other descriptor inherited, default signal mask
// and dispositions, in a session and so a process group of its own (a Ctrl-C meant for
// `flotilla up` does not reach replicas directly: it stops them in order), in `workdir` ("":
// this process's). `env` ("NAME=value") is added to this process's environment, replacing
// variables of the same name. Returns the pid, which is also the process group's id.
Result<int64_t> spawn(const std::vector<std::string>& argv, const std::string& log_path,
                      int stdin_fd, const std::vector<std::string>& env = {},
                      const std::string& workdir = "");

// Sends `signal` to the process group that spawn() made for `pid` (a server's worker processes
// included), or to `pid` alone when it leads no group.
void signal_group(int64_t pid, int signal);

// The pids of processes whose environment holds the entry `marker` ("NAME=value") and that
// lead their process group (as spawn() makes them), this process and its children excepted
// (those whose environment cannot be read are skipped).
std::vector<int64_t> find_marked_processes(const std::string& marker);

// A port free on `host` now (bound to port 0 and released): the replica binds it next.
Result<uint16_t> pick_free_port(const std::string& host);

// The process's start time in clock ticks since boot (/proc/PID/stat field 22); 0 when it
// does not exist.
uint64_t process_start_ticks(int64_t pid);

// The command line of `pid`, its arguments separated by spaces; "" when unreadable.
std::string command_line(int64_t pid);

// The CPU time process `pid` has used (user + system, /proc/PID/stat), in seconds; -1 when it
// does not exist. Thread-safe.
double process_cpu_seconds(int64_t pid);

// The resident memory of process `pid` (/proc/PID/statm), in bytes; -1 when it does not exist.
// Thread-safe.
int64_t process_resident_bytes(int64_t pid);

// Whether process `pid` exists, is not a zombie, and started at `start_ticks`.
bool process_matches(int64_t pid, uint64_t start_ticks);

// "exited with status 2", "killed by signal 9 (Killed)", from a waitpid status.
std::string describe_exit(int status);

// Why a replica that exited by itself stopped, from the end of its log (the last 4 KiB): the
// last line the `flotilla` command printed as its error ("flotilla replica: cannot load model:
// ..."), else the last non-empty line (a JSON log line: its level and message); "" when
// unreadable.
std::string exit_reason_from_log(const std::string& path);

// Makes cgroup `dir` with cpu.max and memory.max set (0: no limit) and moves `pid` into it.
Status make_cgroup(const std::string& dir, double cpus, int64_t memory_bytes, int64_t pid);

}  // namespace flotilla::orchestrator
