// Models trained by tests/fixtures/make_models.py (python3-xgboost), once per test binary.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace flotilla::testing {

inline const std::string& model_fixtures_dir() {
  static const std::string dir = [] {
    std::string path =
        (std::filesystem::temp_directory_path() / ("flotilla-models-" + std::to_string(::getpid())))
            .string();
    std::filesystem::create_directories(path);
    const std::string command = "/usr/bin/python3 " + std::string(FLOTILLA_FIXTURES) +
                                "/make_models.py " + path + " > /dev/null";
    if (std::system(command.c_str()) != 0) {
      ADD_FAILURE() << "cannot train fixture models: " << command;
    }
    return path;
  }();
  return dir;
}

}  // namespace flotilla::testing
