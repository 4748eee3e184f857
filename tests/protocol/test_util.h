#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace flotilla::testing {

inline std::string read_test_data(const std::string& relative) {
  std::ifstream file(std::string(FLOTILLA_TEST_DATA) + "/" + relative);
  std::stringstream content;
  content << file.rdbuf();
  return content.str();
}

// Drops the whitespace between JSON tokens (outside strings) so golden files can be pretty.
inline std::string compact_json(const std::string& text) {
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
      out += c;
    } else if (c != ' ' && c != '\n' && c != '\t' && c != '\r') {
      out += c;
    }
  }
  return out;
}

}  // namespace flotilla::testing
