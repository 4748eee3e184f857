// SHA-256 and lowercase hex: the one digest helper of the code base (store blobs and manifests,
// gateway token hashes, control spec keys). Backed by OpenSSL's EVP (which uses the CPU's SHA
// extensions where it has them); the header does not include OpenSSL.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace flotilla {

// Lowercase hex of `size` bytes at `data`: two digits a byte, high nibble first.
std::string hex_encode(const unsigned char* data, size_t size);
std::string hex_encode(std::string_view bytes);

// Incremental SHA-256. Not thread-safe; one per stream of data.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void update(const void* data, size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // 64 lowercase hex digits of everything updated so far; call once, at the end. "" when OpenSSL
  // failed (no digest context, a digest call that returned an error).
  std::string hex_digest();

 private:
  struct CtxDeleter {
    void operator()(evp_md_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_md_ctx_st, CtxDeleter> context_;
  bool ok_ = false;
};

// 64 lowercase hex digits of SHA-256(data); "" when OpenSSL failed.
std::string sha256_hex(std::string_view data);

}  // namespace flotilla
