#include "common/common.h"

namespace flotilla {

uint64_t Random::uniform(uint64_t n) {
  FLOTILLA_DCHECK(n > 0);
  // Lemire's multiply-shift: unbiased enough for n far below 2^64, and division-free.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
}

uint64_t SeededRandom::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace flotilla
