// URLs, manifests and file digests.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "store/store.h"

namespace flotilla::store {
namespace {

namespace fs = std::filesystem;

bool is_hex_digest(std::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// A relative '/'-separated path with no empty, "." or ".." part, and no NUL.
bool is_safe_relative(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string_view::npos) {
    return false;
  }
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") {
      return false;
    }
    start = end + 1;
  }
  return true;
}

}  // namespace

bool is_url(std::string_view text) {
  return text.starts_with("http://") || text.starts_with("https://");
}

Result<Url> parse_url(std::string_view text) {
  Url url;
  if (const size_t hash = text.find('#'); hash != std::string_view::npos) {
    const std::string_view fragment = text.substr(hash + 1);
    text = text.substr(0, hash);
    if (!fragment.starts_with("sha256=") || !is_hex_digest(fragment.substr(7))) {
      return invalid_argument("URL fragment '#" + std::string(fragment) +
                              "' must be sha256=<64 lowercase hex digits>");
    }
    url.sha256 = std::string(fragment.substr(7));
  }
  FLOTILLA_ASSIGN_OR_RETURN(http::Url base, http::parse_url(text));
  static_cast<http::Url&>(url) = std::move(base);
  return url;
}

Result<Manifest> parse_manifest(std::string_view text) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object() || !json.contains("files") ||
      !json["files"].is_array()) {
    return invalid_argument("manifest: expected a JSON object with a \"files\" array");
  }
  Manifest manifest;
  std::set<std::string> seen;
  size_t index = 0;
  for (const nlohmann::json& entry : json["files"]) {
    const std::string where = "manifest: files[" + std::to_string(index++) + "]";
    if (!entry.is_object() || !entry.contains("path") || !entry["path"].is_string() ||
        !entry.contains("size") || !entry["size"].is_number_unsigned() ||
        !entry.contains("sha256") || !entry["sha256"].is_string()) {
      return invalid_argument(where +
                              ": needs \"path\" (string), \"size\" (unsigned) and "
                              "\"sha256\" (string)");
    }
    ManifestFile file{entry["path"].get<std::string>(), entry["size"].get<uint64_t>(),
                      entry["sha256"].get<std::string>()};
    if (!is_safe_relative(file.path)) {
      return invalid_argument(where + ": path '" + file.path +
                              "' must be relative, without '.', '..' or empty parts");
    }
    if (!is_hex_digest(file.sha256)) {
      return invalid_argument(where + ": sha256 must be 64 lowercase hex digits");
    }
    if (!seen.insert(file.path).second) {
      return invalid_argument(where + ": path '" + file.path + "' appears twice");
    }
    manifest.files.push_back(std::move(file));
  }
  std::sort(manifest.files.begin(), manifest.files.end(),
            [](const ManifestFile& a, const ManifestFile& b) { return a.path < b.path; });
  // A file and a directory of the same name cannot both exist.
  for (size_t i = 1; i < manifest.files.size(); ++i) {
    if (manifest.files[i].path.starts_with(manifest.files[i - 1].path + "/")) {
      return invalid_argument("manifest: '" + manifest.files[i - 1].path +
                              "' is both a file and a directory");
    }
  }
  return manifest;
}

std::string manifest_json(const Manifest& manifest) {
  nlohmann::json files = nlohmann::json::array();
  for (const ManifestFile& file : manifest.files) {
    files.push_back({{"path", file.path}, {"size", file.size}, {"sha256", file.sha256}});
  }
  return nlohmann::json{{"files", files}}.dump(2) + "\n";
}

Result<std::string> sha256_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return unavailable("cannot read '" + path + "': " + std::strerror(errno));
  }
  Sha256 sha;
  std::vector<unsigned char> buffer(1 << 20);
  Status status = Status::ok();
  for (;;) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got < 0) {
      status = unavailable("cannot read '" + path + "': " + std::strerror(errno));
      break;
    }
    if (got == 0) {
      break;
    }
    sha.update(buffer.data(), static_cast<size_t>(got));
  }
  ::close(fd);
  FLOTILLA_RETURN_IF_ERROR(status);
  return sha.hex_digest();
}

Result<Manifest> pack_directory(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return invalid_argument("'" + dir + "' is not a directory");
  }
  Manifest manifest;
  const fs::path root = fs::path(dir);
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string relative = fs::relative(entry.path(), root, ec).generic_string();
    if (entry.is_symlink(ec)) {
      return invalid_argument("'" + entry.path().string() +
                              "' is a symbolic link: pack the files it points to instead");
    }
    if (entry.is_directory(ec)) {
      continue;
    }
    if (!entry.is_regular_file(ec)) {
      return invalid_argument("'" + entry.path().string() + "' is not a regular file");
    }
    if (relative == kManifestName) {
      continue;
    }
    FLOTILLA_ASSIGN_OR_RETURN(std::string digest, sha256_file(entry.path().string()));
    manifest.files.push_back(ManifestFile{relative, entry.file_size(ec), std::move(digest)});
  }
  if (ec) {
    return unavailable("cannot list '" + dir + "': " + ec.message());
  }
  std::sort(manifest.files.begin(), manifest.files.end(),
            [](const ManifestFile& a, const ManifestFile& b) { return a.path < b.path; });
  const std::string path = (root / kManifestName).string();
  std::ofstream out(path, std::ios::trunc);
  out << manifest_json(manifest);
  out.close();
  if (!out) {
    return unavailable("cannot write '" + path + "'");
  }
  return manifest;
}

}  // namespace flotilla::store
