// The portable kernels, weight conversion and the dispatch between paths.
#include "llm/kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <spdlog/spdlog.h>

#include "llm/safetensors.h"

namespace flotilla::llm {
namespace {

// AMX int8 and bf16: the CPU's tiles (CPUID 7.0 EDX bits 22, 24, 25), the OS saving their
// state (XCR0 bits 17, 18), and Linux letting this process use them (arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA, Linux 5.16 on; until then the first tile instruction
// faults).
bool amx_usable() {
#if defined(__x86_64__) && defined(__linux__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 ||
      (edx & (0xdu << 22)) != (0xdu << 22)) {
    return false;
  }
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 27)) == 0) {  // OSXSAVE
    return false;
  }
  unsigned xcr0 = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  if ((xcr0 & (3u << 17)) != (3u << 17)) {
    return false;
  }
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

std::array<float, 256> build_fp8_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    int exponent = (code >> 3) & 0xf;
    int mantissa = code & 0x7;
    float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                    : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
    if ((code & 0x7f) == 0x7f) {
      magnitude = 0;  // NaN in e4m3; never produced by float_to_fp8_e4m3
    }
    table[code] = (code & 0x80) ? -magnitude : magnitude;
  }
  return table;
}

const std::array<float, 256> kFp8Table = build_fp8_table();

// The weight at column c of row r, as fp32 before the row scale.
inline float weight_at(const WeightMatrix& w, int r, int c) {
  int64_t index = static_cast<int64_t>(r) * w.cols + c;
  switch (w.format) {
    case WeightFormat::kF32: {
      float value;
      std::memcpy(&value, w.data + index * 4, 4);
      return value;
    }
    case WeightFormat::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, w.data + index * 2, 2);
      return bf16_to_float(bits);
    }
    case WeightFormat::kInt8:
      return static_cast<float>(static_cast<int8_t>(w.data[index]));
    case WeightFormat::kFp8:
      return kFp8Table[static_cast<uint8_t>(w.data[index])];
  }
  return 0;
}

void portable_matmul(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end,
                     float* y, int ldy, bool accumulate, const void* /*prepared*/) {
  std::vector<float> row(w.cols);
  for (int r = row_begin; r < row_end; ++r) {
    for (int c = 0; c < w.cols; ++c) {
      row[c] = weight_at(w, r, c);
    }
    float scale = w.scales.empty() ? 1.0f : w.scales[r];
    float bias = w.bias.empty() ? 0.0f : w.bias[r];
    for (int i = 0; i < m; ++i) {
      const float* xi = x + static_cast<int64_t>(i) * w.cols;
      float sum = 0;
      for (int c = 0; c < w.cols; ++c) {
        sum += xi[c] * row[c];
      }
      float& out = y[static_cast<int64_t>(i) * ldy + r];
      out = (accumulate ? out : 0.0f) + sum * scale + bias;
    }
  }
}

void portable_dot_rows(const float* q, const float* k, int tokens, int n, float* scores) {
  for (int t = 0; t < tokens; ++t) {
    float sum = 0;
    for (int i = 0; i < n; ++i) {
      sum += q[i] * k[static_cast<int64_t>(t) * n + i];
    }
    scores[t] = sum;
  }
}

void portable_weighted_sum(const float* weights, const float* v, int tokens, int n, float* out) {
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < n; ++i) {
      out[i] += weights[t] * v[static_cast<int64_t>(t) * n + i];
    }
  }
}

void portable_silu_mul(float* gate, const float* up, int n) {
  for (int i = 0; i < n; ++i) {
    gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
}

const Kernels kPortable{
    "portable", portable_matmul, portable_dot_rows, portable_weighted_sum, portable_silu_mul,
    1,          nullptr};

}  // namespace

int64_t WeightMatrix::row_bytes() const {
  return int64_t{cols} * element_bytes(format);
}

int64_t WeightMatrix::bytes() const {
  return rows * row_bytes();
}

const float* fp8_e4m3_table() {
  return kFp8Table.data();
}

uint8_t float_to_fp8_e4m3(float value) {
  // Codes 0x00..0x7e are the non-negative values in increasing order.
  float magnitude = std::min(std::fabs(value), 448.0f);
  const float* begin = kFp8Table.data();
  const float* upper = std::lower_bound(begin, begin + 0x7f, magnitude);
  int code = static_cast<int>(upper - begin);
  if (code == 0x7f) {
    code = 0x7e;
  } else if (code > 0) {
    float above = kFp8Table[code] - magnitude;
    float below = magnitude - kFp8Table[code - 1];
    if (below < above || (below == above && (code - 1) % 2 == 0)) {
      code -= 1;
    }
  }
  return static_cast<uint8_t>(code | (std::signbit(value) && code != 0 ? 0x80 : 0));
}

WeightMatrix make_weight_matrix(WeightFormat format, int rows, int cols, const float* values) {
  WeightMatrix w;
  w.format = format;
  w.rows = rows;
  w.cols = cols;
  int64_t n = static_cast<int64_t>(rows) * cols;
  switch (format) {
    case WeightFormat::kF32:
      w.owned.resize(n * 4);
      std::memcpy(w.owned.data(), values, n * 4);
      break;
    case WeightFormat::kBF16:
      w.owned.resize(n * 2);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits = float_to_bf16(values[i]);
        std::memcpy(w.owned.data() + i * 2, &bits, 2);
      }
      break;
    case WeightFormat::kInt8:
    case WeightFormat::kFp8: {
      w.owned.resize(n);
      w.scales.resize(rows);
      float range = format == WeightFormat::kInt8 ? 127.0f : 448.0f;
      for (int r = 0; r < rows; ++r) {
        const float* row = values + static_cast<int64_t>(r) * cols;
        float amax = 0;
        for (int c = 0; c < cols; ++c) {
          amax = std::max(amax, std::fabs(row[c]));
        }
        float scale = amax > 0 ? amax / range : 1.0f;
        w.scales[r] = scale;
        for (int c = 0; c < cols; ++c) {
          float scaled = row[c] / scale;
          uint8_t code = format == WeightFormat::kInt8
                             ? static_cast<uint8_t>(static_cast<int8_t>(
                                   std::lrint(std::clamp(scaled, -127.0f, 127.0f))))
                             : float_to_fp8_e4m3(scaled);
          w.owned[static_cast<int64_t>(r) * cols + c] = static_cast<std::byte>(code);
        }
      }
      break;
    }
  }
  w.data = w.owned.data();
  return w;
}

const Kernels& portable_kernels() {
  return kPortable;
}

std::vector<const Kernels*> supported_kernels() {
  std::vector<const Kernels*> supported = {&kPortable};
  const Kernels* avx2 = avx2_kernels();
  if (avx2 == nullptr) {
    return supported;
  }
  supported.push_back(avx2);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // libgcc's and compiler-rt's checks include the OS saving the AVX-512 state (XCR0).
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  if (!avx512 || avx512_kernel_table(false, false) == nullptr) {
    return supported;
  }
  const bool vnni = __builtin_cpu_supports("avx512vnni");
  const bool bf16 = __builtin_cpu_supports("avx512bf16");
  supported.push_back(avx512_kernel_table(false, false));
  if (vnni) {
    supported.push_back(avx512_kernel_table(true, false));
  }
  if (bf16) {
    supported.push_back(avx512_kernel_table(false, true));
  }
  if (vnni && bf16) {
    supported.push_back(avx512_kernel_table(true, true));
    if (amx_kernel_table() != nullptr && amx_usable()) {
      supported.push_back(amx_kernel_table());
    }
  }
#endif
  return supported;
}

const Kernels& kernels() {
  static const Kernels& chosen = []() -> const Kernels& {
    const std::vector<const Kernels*> supported = supported_kernels();
    const char* forced = std::getenv("FLOTILLA_LLM_KERNELS");
    if (forced != nullptr && *forced != '\0') {
      for (const Kernels* k : supported) {
        if (k->name == forced) {
          return *k;
        }
      }
      spdlog::warn("FLOTILLA_LLM_KERNELS={}: not a kernel path this CPU runs; using {}", forced,
                   supported.back()->name);
    }
    return *supported.back();
  }();
  return chosen;
}

}  // namespace flotilla::llm
