#include "llm/safetensors.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace flotilla::llm {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// Headers are small (a few hundred bytes per tensor); this bounds what a bad file can make us
// parse.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

Result<TensorDtype> parse_dtype(const std::string& name) {
  if (name == "F32") {
    return TensorDtype::kF32;
  }
  if (name == "F16") {
    return TensorDtype::kF16;
  }
  if (name == "BF16") {
    return TensorDtype::kBF16;
  }
  return invalid_argument("dtype " + name + " is not supported (F32, F16, BF16 are)");
}

int64_t dtype_bytes(TensorDtype dtype) {
  return dtype == TensorDtype::kF32 ? 4 : 2;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return not_found("cannot read " + path);
  }
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(uint32_t{bits} << 16);
}

uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffff) > 0x7f800000) {  // NaN stays NaN
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

float fp16_to_float(uint16_t bits) {
  uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24
    float value = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -value : value;
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

int64_t TensorView::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    n *= d;
  }
  return n;
}

float TensorView::at(int64_t index) const {
  const std::byte* p = data.data() + index * dtype_bytes(dtype);
  if (dtype == TensorDtype::kF32) {
    float value;
    std::memcpy(&value, p, 4);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return dtype == TensorDtype::kBF16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return not_found("cannot open " + path + ": " + std::strerror(errno));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || info.st_size == 0) {
    ::close(fd);
    return invalid_argument(path + " is empty or unreadable");
  }
  void* data = ::mmap(nullptr, info.st_size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (data == MAP_FAILED) {
    return internal_error("cannot map " + path + ": " + std::strerror(errno));
  }
  return std::unique_ptr<MappedFile>(
      new MappedFile(static_cast<const std::byte*>(data), static_cast<size_t>(info.st_size)));
}

MappedFile::~MappedFile() {
  ::munmap(const_cast<std::byte*>(data_), size_);
}

Status SafetensorsSet::add_file(const std::string& path) {
  if (await_) {
    FLOTILLA_RETURN_IF_ERROR(await_(path, 0, 8));  // also sizes the file
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::open(path));
  std::span<const std::byte> bytes = file->bytes();
  uint64_t header_bytes = 0;
  if (bytes.size() < 8) {
    return invalid_argument(path + ": truncated (no header length)");
  }
  std::memcpy(&header_bytes, bytes.data(), 8);  // little-endian, as is every target we build for
  if (header_bytes > kMaxHeaderBytes || 8 + header_bytes > bytes.size()) {
    return invalid_argument(path + ": header length " + std::to_string(header_bytes) +
                            " is past the end of the file");
  }
  if (await_) {
    FLOTILLA_RETURN_IF_ERROR(await_(path, 8, header_bytes));
  }
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, header_bytes);
  Json header = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return invalid_argument(path + ": header is not a JSON object");
  }
  std::span<const std::byte> data = bytes.subspan(8 + header_bytes);
  for (const auto& item : header.items()) {
    // Not a structured binding: the lambda below captures the name, which clang 14 (the fuzz
    // build's) cannot do for a binding.
    const std::string& name = item.key();
    const Json& entry = item.value();
    if (name == "__metadata__") {
      continue;
    }
    auto fail = [&](const std::string& why) {
      return invalid_argument(path + ": tensor '" + name + "': " + why);
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return fail("needs dtype, shape and data_offsets");
    }
    TensorView view;
    view.name = name;
    view.file = path;
    Result<TensorDtype> dtype = parse_dtype(entry["dtype"].get<std::string>());
    if (!dtype.is_ok()) {
      return fail(dtype.status().message());
    }
    view.dtype = *dtype;
    int64_t elements = 1;
    for (const Json& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40)) {
        return fail("bad shape");
      }
      view.shape.push_back(d.get<int64_t>());
      // Checked: a product that wrapped around could match the few bytes a huge shape holds.
      if (__builtin_mul_overflow(elements, view.shape.back(), &elements) ||
          elements > (int64_t{1} << 60)) {
        return fail("shape " + shape_string(view.shape) + " has too many elements");
      }
    }
    const Json& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return fail("bad data_offsets");
    }
    uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data.size()) {
      return fail("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") are past the end of the file");
    }
    if (end - begin != static_cast<uint64_t>(elements * dtype_bytes(view.dtype))) {
      return fail("holds " + std::to_string(end - begin) + " bytes, shape " +
                  shape_string(view.shape) + " needs " +
                  std::to_string(elements * dtype_bytes(view.dtype)));
    }
    view.data = data.subspan(begin, end - begin);
    view.file_offset = 8 + header_bytes + begin;
    if (!tensors_.emplace(name, std::move(view)).second) {
      return fail("appears in two files");
    }
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

Result<SafetensorsSet> SafetensorsSet::open_directory(const std::string& dir, AwaitBytes await) {
  SafetensorsSet set;
  set.await_ = std::move(await);
  fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index_path)) {
    fs::path single = fs::path(dir) / "model.safetensors";
    if (!fs::exists(single)) {
      return not_found(dir + " has neither model.safetensors nor model.safetensors.index.json");
    }
    FLOTILLA_RETURN_IF_ERROR(set.add_file(single.string()));
    return set;
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path.string()));
  Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return invalid_argument(index_path.string() + ": needs a 'weight_map' object");
  }
  std::set<std::string> shards;
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    std::string name = file.is_string() ? file.get<std::string>() : "";
    if (name.empty() || name.find('/') != std::string::npos || name.starts_with(".")) {
      return invalid_argument(index_path.string() + ": tensor '" + tensor +
                              "' names no plain file in the directory");
    }
    shards.insert(name);
  }
  for (const std::string& shard : shards) {
    FLOTILLA_RETURN_IF_ERROR(set.add_file((fs::path(dir) / shard).string()));
  }
  return set;
}

Result<const TensorView*> SafetensorsSet::get(const std::string& name,
                                              std::vector<int64_t> shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return not_found("tensor '" + name + "' is missing");
  }
  if (it->second.shape != shape) {
    return invalid_argument("tensor '" + name + "' in " + it->second.file + " has shape " +
                            shape_string(it->second.shape) + ", the config needs " +
                            shape_string(shape));
  }
  if (await_) {
    const TensorView& view = it->second;
    FLOTILLA_RETURN_IF_ERROR(await_(view.file, view.file_offset, view.data.size()));
  }
  return &it->second;
}

}  // namespace flotilla::llm
