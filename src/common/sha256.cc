#include <openssl/evp.h>

#include "common/common_sha256.h"

namespace flotilla {
namespace {

// Fetched once: OpenSSL 3's implicit fetch behind EVP_sha256() takes a global lock on every
// digest, which workers hashing concurrently would contend on. Never freed; it lives as long as
// the process.
const EVP_MD* sha256_md() {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  static const EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
#else
  return EVP_sha256();
#endif
}

}  // namespace

std::string hex_encode(const unsigned char* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    hex[2 * i] = kDigits[data[i] >> 4];
    hex[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return hex;
}

std::string hex_encode(std::string_view bytes) {
  return hex_encode(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

void Sha256::CtxDeleter::operator()(evp_md_ctx_st* ctx) const {
  EVP_MD_CTX_free(ctx);
}

Sha256::Sha256() : context_(EVP_MD_CTX_new()) {
  const EVP_MD* md = sha256_md();
  ok_ = md != nullptr && context_ != nullptr && EVP_DigestInit_ex(context_.get(), md, nullptr) == 1;
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(const void* data, size_t size) {
  if (ok_) {
    ok_ = EVP_DigestUpdate(context_.get(), data, size) == 1;
  }
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!ok_ || EVP_DigestFinal_ex(context_.get(), digest, &length) != 1) {
    ok_ = false;
    return "";
  }
  ok_ = false;  // finalised: a second call answers ""
  return hex_encode(digest, length);
}

std::string sha256_hex(std::string_view data) {
  Sha256 sha;
  sha.update(data);
  return sha.hex_digest();
}

}  // namespace flotilla
