// The external runtime's file-system lookups (common.h), shared by the spec's checks and the
// local orchestrator.
#include <cstdlib>
#include <filesystem>

#include <unistd.h>

#include "common/common.h"

namespace flotilla {
namespace {

namespace fs = std::filesystem;

bool is_executable_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string external_workdir(const ExternalCommand& external, const std::string& model) {
  if (!external.workdir.empty()) {
    return external.workdir;
  }
  std::error_code ec;
  if (fs::is_directory(model, ec)) {
    return model;
  }
  return fs::path(model).parent_path().string();
}

Result<std::string> find_program(const ExternalCommand& external, const std::string& workdir) {
  const std::string& program = external.command.empty() ? std::string() : external.command[0];
  if (program.empty()) {
    return not_found("no program to run: command is empty");
  }
  if (program.find('/') != std::string::npos) {
    const fs::path path = program.front() == '/' ? fs::path(program) : fs::path(workdir) / program;
    if (!is_executable_file(path)) {
      return not_found("'" + path.lexically_normal().string() + "' is not an executable file");
    }
    return path.lexically_normal().string();
  }
  std::string search;
  if (auto path = external.env.find("PATH"); path != external.env.end()) {
    search = path->second;
  } else if (const char* ours = std::getenv("PATH")) {
    search = ours;
  }
  size_t at = 0;
  while (at <= search.size()) {
    size_t end = search.find(':', at);
    if (end == std::string::npos) {
      end = search.size();
    }
    // An empty entry is the working directory, as for execvp.
    const fs::path dir = end == at ? fs::path(workdir) : fs::path(search.substr(at, end - at));
    const fs::path candidate =
        dir.is_absolute() ? dir / program : fs::path(workdir) / dir / program;
    if (is_executable_file(candidate)) {
      return candidate.lexically_normal().string();
    }
    at = end + 1;
  }
  return not_found("'" + program + "' is not an executable on PATH");
}

}  // namespace flotilla
