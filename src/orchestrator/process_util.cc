#include "orchestrator/process_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "orchestrator/orchestrator.h"

extern char** environ;

namespace flotilla::orchestrator {
namespace {

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) {
    return unavailable("cannot write '" + text + "' to " + path + ": " + std::strerror(errno));
  }
  return Status::ok();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// "error: cannot load model ..." from a JSON log line (common/common_logging.h); any other
// line as it is.
std::string log_message(const std::string& line) {
  if (!line.starts_with('{')) {
    return line;
  }
  const nlohmann::json entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!entry.is_object() || !entry.contains("message") || !entry["message"].is_string()) {
    return line;
  }
  const auto level = entry.find("level");
  return (level != entry.end() && level->is_string() ? level->get<std::string>() + ": " : "") +
         entry["message"].get<std::string>();
}

}  // namespace

Result<int64_t> spawn(const std::vector<std::string>& argv, const std::string& log_path,
                      int stdin_fd, const std::vector<std::string>& env,
                      const std::string& workdir) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);

  if (stdin_fd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, stdin_fd, 0);
  } else {
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  }
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // The gateway's listening sockets and the database must not leak into replicas: a replica
  // outliving a killed `flotilla up` would otherwise hold its ports.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  if (!workdir.empty()) {
    // Last: the log path above is opened from this process's working directory.
    posix_spawn_file_actions_addchdir_np(&actions, workdir.c_str());
  }

  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t empty;
  sigemptyset(&empty);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int signal : {SIGTERM, SIGINT, SIGPIPE, SIGHUP, SIGCHLD}) {
    sigaddset(&defaults, signal);
  }
  posix_spawnattr_setsigmask(&attributes, &empty);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  // A session of its own (so also a process group of its own, which stop() signals): the
  // terminal's Ctrl-C reaches `flotilla up` alone, which drains its replicas in order, and where
  // the kernel groups tasks by session for fair CPU shares (autogroup, on by default), each
  // replica is a group of its own, as a pod is a cgroup of its own. In the gateway's session
  // its event loop shared one group's CPU share with every replica, which preempted it at
  // each request they were sent and so took their requests one by one (issue #25 item 3).
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);

  std::vector<char*> args;
  for (const std::string& arg : argv) {
    args.push_back(const_cast<char*>(arg.c_str()));
  }
  args.push_back(nullptr);
  std::vector<char*> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::string_view name = text.substr(0, text.find('=') + 1);
    const bool replaced = std::any_of(
        env.begin(), env.end(), [&](const std::string& extra) { return extra.starts_with(name); });
    if (!replaced) {
      environment.push_back(*entry);
    }
  }
  for (const std::string& extra : env) {
    environment.push_back(const_cast<char*>(extra.c_str()));
  }
  environment.push_back(nullptr);
  pid_t pid = 0;
  const int error =
      posix_spawn(&pid, argv[0].c_str(), &actions, &attributes, args.data(), environment.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) {
    return unavailable("cannot start '" + argv[0] + "': " + std::strerror(error));
  }
  return static_cast<int64_t>(pid);
}

void signal_group(int64_t pid, int signal) {
  if (::kill(-static_cast<pid_t>(pid), signal) != 0) {
    ::kill(static_cast<pid_t>(pid), signal);
  }
}

Result<uint16_t> pick_free_port(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return unavailable(std::string("socket: ") + std::strerror(errno));
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    ::close(fd);
    return invalid_argument("'" + host + "' is not an IPv4 address");
  }
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return unavailable("cannot find a free port on " + host + ": " + error);
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

// Fields 3 (the state) to 22 (the start time) of /proc/PID/stat, field N at index N - 3; empty
// when the process does not exist.
std::vector<std::string> stat_fields(int64_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  // The command name (field 2) may hold spaces and parentheses: fields count from the last ')'.
  const size_t end = stat.rfind(')');
  if (end == std::string::npos || end + 2 > stat.size()) {
    return {};
  }
  std::istringstream stream(stat.substr(end + 2));
  std::vector<std::string> fields;
  for (std::string field; fields.size() < 20 && stream >> field;) {
    fields.push_back(std::move(field));
  }
  return fields.size() == 20 ? fields : std::vector<std::string>{};
}

uint64_t process_start_ticks(int64_t pid) {
  const std::vector<std::string> fields = stat_fields(pid);
  if (fields.empty() || fields[0] == "Z") {
    return 0;
  }
  return std::strtoull(fields[22 - 3].c_str(), nullptr, 10);
}

double process_cpu_seconds(int64_t pid) {
  // utime and stime, fields 14 and 15, in clock ticks.
  const std::vector<std::string> fields = stat_fields(pid);
  if (fields.empty()) {
    return -1;
  }
  const double ticks =
      std::strtod(fields[14 - 3].c_str(), nullptr) + std::strtod(fields[15 - 3].c_str(), nullptr);
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

int64_t process_resident_bytes(int64_t pid) {
  // "size resident shared ...", in pages.
  const std::string statm = read_file("/proc/" + std::to_string(pid) + "/statm");
  const size_t space = statm.find(' ');
  if (space == std::string::npos) {
    return -1;
  }
  const int64_t pages = std::strtoll(statm.c_str() + space + 1, nullptr, 10);
  return pages * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

std::vector<int64_t> find_marked_processes(const std::string& marker) {
  std::vector<int64_t> found;
  const int64_t self = ::getpid();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) {
      continue;
    }
    const int64_t pid = std::strtoll(name.c_str(), nullptr, 10);
    if (pid == self) {
      continue;
    }
    // NUL-separated "NAME=value" entries; unreadable (another user's) reads as empty.
    const std::string environment = read_file(entry.path().string() + "/environ");
    bool marked = false;
    for (size_t start = 0; start < environment.size() && !marked;) {
      size_t end = environment.find('\0', start);
      end = end == std::string::npos ? environment.size() : end;
      marked = std::string_view(environment).substr(start, end - start) == marker;
      start = end + 1;
    }
    if (!marked) {
      continue;
    }
    const std::vector<std::string> fields = stat_fields(pid);
    // Field 4: the parent. Our own children are ours to manage, not strays. Field 5: the
    // process group. spawn() makes each process lead one; one that leads none was started by
    // such a process (an external server's workers) and goes with its group's leader.
    if (fields.size() < 3 || fields[0] == "Z" ||
        std::strtoll(fields[4 - 3].c_str(), nullptr, 10) == self ||
        std::strtoll(fields[5 - 3].c_str(), nullptr, 10) != pid) {
      continue;
    }
    found.push_back(pid);
  }
  return found;
}

std::string command_line(int64_t pid) {
  std::string text = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  while (!text.empty() && text.back() == '\0') {
    text.pop_back();
  }
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

bool exit_with_parent() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Set by the orchestrator for its standbys: a parent that died before prctl() left this
  // process to pid 1 (or a subreaper), and no death signal will come.
  const char* expected = std::getenv(std::string(kParentEnv).c_str());
  return expected == nullptr || std::strtoll(expected, nullptr, 10) == ::getppid();
}

void disarm_parent_death() {
  ::prctl(PR_SET_PDEATHSIG, 0);
}

bool process_matches(int64_t pid, uint64_t start_ticks) {
  return pid > 0 && start_ticks != 0 && process_start_ticks(pid) == start_ticks;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) {
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  }
  return "ended (status " + std::to_string(status) + ")";
}

std::string exit_reason_from_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return "";
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - 4096);
  in.seekg(start);
  std::string tail(static_cast<size_t>(size - start), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  std::istringstream lines(tail);
  std::string line;
  std::string last;
  std::string command_error;
  while (std::getline(lines, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
      line.pop_back();
    }
    if (line.empty()) {
      continue;
    }
    last = log_message(line);
    if (line.starts_with("flotilla ")) {
      command_error = line;
    }
  }
  return command_error.empty() ? last : command_error;
}

std::string cgroup_unavailable_reason(const std::string& cgroup_root) {
  const std::filesystem::path root(cgroup_root);
  const std::filesystem::path parent = root.parent_path();
  if (!std::filesystem::exists(parent / "cgroup.controllers")) {
    return "cgroup v2 is not mounted at " + parent.string() +
           " (this machine uses cgroup v1 or none)";
  }
  // A space-separated list: "cpuset cpu io memory pids".
  std::istringstream controllers(read_file((parent / "cgroup.controllers").string()));
  bool cpu = false;
  bool memory = false;
  for (std::string name; controllers >> name;) {
    cpu = cpu || name == "cpu";
    memory = memory || name == "memory";
  }
  if (!cpu || !memory) {
    return "the cpu and memory controllers are not available in " + parent.string();
  }
  std::error_code error;
  std::filesystem::create_directories(root, error);
  if (error) {
    return "cannot create " + root.string() + ": " + error.message();
  }
  // Controllers must be enabled for the children of both the parent and our root.
  if (!write_file((parent / "cgroup.subtree_control").string(), "+cpu +memory").is_ok() ||
      !write_file((root / "cgroup.subtree_control").string(), "+cpu +memory").is_ok()) {
    return "cannot enable the cpu and memory controllers under " + root.string();
  }
  return "";
}

Status make_cgroup(const std::string& dir, double cpus, int64_t memory_bytes, int64_t pid) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return unavailable("cannot create " + dir + ": " + error.message());
  }
  constexpr int64_t kPeriodUs = 100'000;
  if (cpus > 0) {
    const auto quota = static_cast<int64_t>(std::llround(cpus * kPeriodUs));
    FLOTILLA_RETURN_IF_ERROR(
        write_file(dir + "/cpu.max", std::to_string(quota) + " " + std::to_string(kPeriodUs)));
  }
  if (memory_bytes > 0) {
    FLOTILLA_RETURN_IF_ERROR(write_file(dir + "/memory.max", std::to_string(memory_bytes)));
  }
  return write_file(dir + "/cgroup.procs", std::to_string(pid));
}

}  // namespace flotilla::orchestrator
