// Reads safetensors files (8-byte little-endian header length, JSON header, raw tensor data),
// memory-mapped, one file or shards listed by model.safetensors.index.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/common.h"

namespace flotilla::llm {

enum class TensorDtype { kF32, kF16, kBF16 };

// One tensor inside a mapped file; `data` stays valid while its SafetensorsSet lives.
struct TensorView {
  std::string name;
  std::string file;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
  uint64_t file_offset = 0;  // of data[0] in the file

  int64_t elements() const;
  // The value at `index` converted to fp32.
  float at(int64_t index) const;
};

// Blocks until bytes [offset, offset + length) of the file `path` may be read: a model whose
// files are still downloading (lazy loading; the store module). Empty: every file is complete.
using AwaitBytes = std::function<Status(const std::string& path, uint64_t offset, uint64_t length)>;

// A read-only mapping of a whole file, unmapped on destruction. Shared, so that bytes written
// to the file after it was mapped (a download still running) are seen.
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  MappedFile(const std::byte* data, size_t size) : data_(data), size_(size) {}
  const std::byte* data_;
  size_t size_;
};

// Every tensor of a model directory's safetensors files.
class SafetensorsSet {
 public:
  // model.safetensors.index.json when present, else model.safetensors. Errors name the file:
  // missing, truncated, a header that is not JSON, offsets past the end or overlapping the
  // header, a dtype other than F32/F16/BF16, a size that does not match the shape. With
  // `await`, a file's header is read only once awaited, and a tensor's data once get() has
  // awaited it.
  static Result<SafetensorsSet> open_directory(const std::string& dir, AwaitBytes await = {});

  // kNotFound naming the tensor when absent; kInvalidArgument when its shape is not `shape`.
  // Returns once its data may be read.
  Result<const TensorView*> get(const std::string& name, std::vector<int64_t> shape) const;
  // Ends the awaiting once every tensor the model uses was got (`await` may not outlive it).
  void stop_awaiting() { await_ = nullptr; }
  bool contains(const std::string& name) const { return tensors_.count(name) > 0; }

 private:
  Status add_file(const std::string& path);

  std::vector<std::shared_ptr<const MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
  AwaitBytes await_;
};

// The whole of a small text file (config.json, an index); kNotFound naming it when unreadable.
Result<std::string> read_text_file(const std::string& path);

// bf16/fp16 to fp32, exactly.
float bf16_to_float(uint16_t bits);
float fp16_to_float(uint16_t bits);
// fp32 to bf16, rounding to nearest even.
uint16_t float_to_bf16(float value);

}  // namespace flotilla::llm
