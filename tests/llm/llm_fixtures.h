// Tiny random-weight Llama-family models with numpy reference logits, written by
// tests/fixtures/make_llm.py once per test binary into a directory removed at exit.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace flotilla::testing {

class LlmFixtures {
 public:
  static const LlmFixtures& get() {
    static const LlmFixtures fixtures;
    return fixtures;
  }
  ~LlmFixtures() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string model(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir() const { return dir_; }

  // The reference.json of a model.
  nlohmann::json reference(const std::string& name) const {
    std::ifstream file(model(name) + "/reference.json");
    return nlohmann::json::parse(file);
  }

 private:
  LlmFixtures() {
    dir_ = (std::filesystem::temp_directory_path() / ("flotilla-llm-" + std::to_string(::getpid())))
               .string();
    std::filesystem::create_directories(dir_);
    const std::string command = "/usr/bin/python3 " + std::string(FLOTILLA_FIXTURES) +
                                "/make_llm.py " + dir_ + " > /dev/null";
    if (std::system(command.c_str()) != 0) {
      ADD_FAILURE() << "cannot write fixture models: " << command;
    }
  }
  std::string dir_;
};

inline const std::vector<std::string> kLlmFixtureModels = {"llama-gqa", "qwen2-tied", "mistral-f16",
                                                           "llama3-rope"};

}  // namespace flotilla::testing
