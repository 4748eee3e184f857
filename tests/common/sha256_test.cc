#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "common/common_sha256.h"

namespace flotilla {
namespace {

// FIPS 180-2 test vectors (also `printf abc | sha256sum`).
constexpr char kAbcDigest[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr char kEmptyDigest[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST(Sha256Test, MatchesKnownVectors) {
  EXPECT_EQ(sha256_hex("abc"), kAbcDigest);
  EXPECT_EQ(sha256_hex(""), kEmptyDigest);
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, IncrementalUpdatesEqualOneShot) {
  Sha256 sha;
  sha.update("a");
  sha.update(std::string("bc"));
  const char nothing = 0;
  sha.update(&nothing, 0);
  EXPECT_EQ(sha.hex_digest(), kAbcDigest);
  // Finalised: a second digest is refused rather than hashing on from an undefined state.
  EXPECT_EQ(sha.hex_digest(), "");
}

TEST(Sha256Test, MovedHasherKeepsItsState) {
  Sha256 first;
  first.update("ab");
  Sha256 second(std::move(first));
  second.update("c");
  EXPECT_EQ(second.hex_digest(), kAbcDigest);
}

TEST(HexEncodeTest, LowercaseHighNibbleFirst) {
  const unsigned char bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(hex_encode(bytes, sizeof bytes), "000fa5ff");
  EXPECT_EQ(hex_encode(std::string_view("\x01\xab", 2)), "01ab");
  EXPECT_EQ(hex_encode(nullptr, 0), "");
}

}  // namespace
}  // namespace flotilla
