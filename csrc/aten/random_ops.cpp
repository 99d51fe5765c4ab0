// Random ops on neuron tensors, drawn from the device generator's Philox 4x32-10 stream.
//
// Element i of an op's result (in logical, row-major order) draws from offset + i of the
// generator's stream, where offset is what the generator held when the op began; the op then
// advances the generator by its element count, rounded up to 4 (generator.cpp). Offset
// position p is word p % 4 of Philox block p / 4 (key = seed, counter = (p / 4, subsequence)):
// 32-bit draws use subsequence 0, 64-bit draws add the same position of subsequence 1 (and
// normal's last partial block of 16 subsequences 1 to 3). So a draw depends only on (seed,
// offset, index), never on threads or chunking; for the ops of one draw per element a tensor
// drawn in pieces at the offsets DTensor gives its shards equals the tensor drawn whole.
//
// The transformations follow PyTorch's (uniform from the top 24 or 53 bits, Box-Muller over
// blocks of 16 as the CPU's normal kernel pairs them, inverse-CDF forms for the rest). Ops not
// here (multinomial, poisson, gamma, binomial, rrelu, normal with tensor arguments) run the
// CPU's kernel with a CPU generator keyed from this stream (cpuGeneratorFor).
#include "launch.h"
#include "generator.h"
#include "host_addressable.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace torchneuron {
namespace {

constexpr int64_t kChunk = 4096;        // elements a thread draws at a time (a multiple of 16)
constexpr int64_t kSerialChunks = 8;    // tensors of up to this many chunks are drawn on one thread

// ---- the stream ------------------------------------------------------------

// Philox 4x32-10 (Salmon et al., SC'11), the generator of at::philox_engine: blocks
// [first, first + count) of `subsequence`, four 32-bit words each, written to out.
constexpr uint32_t kPhiloxMulA = 0xD2511F53, kPhiloxMulB = 0xCD9E8D57;
constexpr uint32_t kPhiloxWeylA = 0x9E3779B9, kPhiloxWeylB = 0xBB67AE85;

void philoxScalar(uint64_t seed, uint64_t subsequence, uint64_t first, int64_t count, uint32_t* out) {
  for (int64_t j = 0; j < count; ++j) {
    const uint64_t block = first + static_cast<uint64_t>(j);
    uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
    uint32_t c2 = static_cast<uint32_t>(subsequence), c3 = static_cast<uint32_t>(subsequence >> 32);
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = static_cast<uint64_t>(kPhiloxMulA) * c0;
      const uint64_t p1 = static_cast<uint64_t>(kPhiloxMulB) * c2;
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      c0 = n0;
      c2 = n2;
      k0 += kPhiloxWeylA;
      k1 += kPhiloxWeylB;
    }
    uint32_t* o = out + 4 * j;
    o[0] = c0;
    o[1] = c1;
    o[2] = c2;
    o[3] = c3;
  }
}

// The high and low halves of the eight 32x32-bit products x * m.
__attribute__((target("avx2"))) inline void mulHiLo(__m256i x, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(x, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// The same, eight blocks at a time in AVX2 registers (about 0.9 ns a word on this project's
// machines, 3-8x the scalar form).
// Returns the number of blocks written (all but count % 8) and leaves the upper halves of the
// vector registers clean: the compiler's own vzeroupper is skipped on a tail call, and the SSE
// code after it then ran 3x slower.
__attribute__((target("avx2"))) int64_t philoxAvx2(uint64_t seed, uint64_t subsequence, uint64_t first,
                                                   int64_t count, uint32_t* out) {
  const __m256i mul_a = _mm256_set1_epi32(static_cast<int>(kPhiloxMulA));
  const __m256i mul_b = _mm256_set1_epi32(static_cast<int>(kPhiloxMulB));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const uint64_t block = first + static_cast<uint64_t>(j);
    const __m256i base = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(block)));
    __m256i c0 = _mm256_add_epi32(base, lanes);
    // A lane whose low word wrapped carries into the high word (unsigned compare through the sign bit).
    const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(base, sign), _mm256_xor_si256(c0, sign));
    __m256i c1 = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(block >> 32))), carry);
    __m256i c2 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(subsequence)));
    __m256i c3 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(subsequence >> 32)));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      __m256i hi0, lo0, hi1, lo1;
      mulHiLo(c0, mul_a, hi0, lo0);
      mulHiLo(c2, mul_b, hi1, lo1);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c1 = lo1;
      c3 = lo0;
      k0 += kPhiloxWeylA;
      k1 += kPhiloxWeylB;
    }
    // Transpose four registers of eight lanes into eight blocks of four words.
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i b04 = _mm256_unpacklo_epi64(t0, t2), b15 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i b26 = _mm256_unpacklo_epi64(t1, t3), b37 = _mm256_unpackhi_epi64(t1, t3);
    auto* o = reinterpret_cast<__m256i*>(out + 4 * j);
    _mm256_storeu_si256(o, _mm256_permute2x128_si256(b04, b15, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(b26, b37, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(b04, b15, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(b26, b37, 0x31));
  }
  _mm256_zeroupper();
  return j;
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");

void philoxBlocks(uint64_t seed, uint64_t subsequence, uint64_t first, int64_t count, uint32_t* out) {
  const int64_t done = kHaveAvx2 ? philoxAvx2(seed, subsequence, first, count, out) : 0;
  philoxScalar(seed, subsequence, first + static_cast<uint64_t>(done), count - done, out + 4 * done);
}

// The words of positions [draw.offset + begin, draw.offset + begin + n) of a subsequence.
class Words {
 public:
  explicit Words(int64_t capacity) : buffer_(capacity + 8) {}

  const uint32_t* fill(const PhiloxDraw& draw, uint64_t subsequence, int64_t begin, int64_t n) {
    const uint64_t position = draw.offset + static_cast<uint64_t>(begin);
    const int64_t skip = static_cast<int64_t>(position % 4);
    philoxBlocks(draw.seed, subsequence, position / 4, (skip + n + 3) / 4, buffer_.data());
    return buffer_.data() + skip;
  }

 private:
  std::vector<uint32_t> buffer_;
};

// Calls body(begin, n, w0, w1) over [0, numel) in chunks of kChunk elements, on several threads
// for large tensors; w0 holds the chunk's words of subsequence 0, w1 (when `wide`) those of
// subsequence 1.
template <typename Body>
void forChunks(const PhiloxDraw& draw, int64_t numel, bool wide, const Body& body) {
  const int64_t chunks = (numel + kChunk - 1) / kChunk;
  at::parallel_for(0, chunks, kSerialChunks, [&](int64_t first, int64_t last) {
    const int64_t capacity = std::min(kChunk, numel);
    Words lo(capacity), hi(wide ? capacity : 0);
    for (int64_t c = first; c < last; ++c) {
      const int64_t begin = c * kChunk, n = std::min(kChunk, numel - begin);
      body(begin, n, lo.fill(draw, 0, begin, n), wide ? hi.fill(draw, 1, begin, n) : nullptr);
    }
  });
}

inline float uniformFloat(uint32_t w) { return static_cast<float>(w >> 8) * 0x1p-24f; }
inline double uniformDouble(uint32_t w0, uint32_t w1) {
  return static_cast<double>(((static_cast<uint64_t>(w0) << 32) | w1) >> 11) * 0x1p-53;
}
inline uint64_t word64(uint32_t w0, uint32_t w1) { return (static_cast<uint64_t>(w0) << 32) | w1; }

// ---- writing results -------------------------------------------------------

c10::DeviceIndex deviceOf(const at::Tensor& t) { return t.device().index(); }

// Runs fill(scalar_t* data) to produce self's values in logical order: straight into device
// memory when self is contiguous and of type scalar_t, else into a buffer copied over.
template <typename scalar_t, typename Fill>
void produce(const at::Tensor& self, const Fill& fill) {
  auto out = hostView(self);
  if (out.is_contiguous() && out.scalar_type() == c10::CppTypeToScalarType<scalar_t>::value) {
    fill(out.template data_ptr<scalar_t>());
    return;
  }
  auto buffer = at::empty(out.sizes(), out.options().dtype(c10::CppTypeToScalarType<scalar_t>::value));
  fill(buffer.template data_ptr<scalar_t>());
  out.copy_(buffer);
}

// self[i] = value(i, w0, w1) for each element, in the compute type of self's dtype.
template <typename scalar_t, typename Value>
at::Tensor& elementwise(at::Tensor& self, const std::optional<at::Generator>& gen, bool wide, const Value& value) {
  const int64_t numel = self.numel();
  if (numel == 0) return self;
  const PhiloxDraw draw = reservePhilox(gen, deviceOf(self), numel);
  produce<scalar_t>(self, [&](scalar_t* data) {
    forChunks(draw, numel, wide, [&](int64_t begin, int64_t n, const uint32_t* w0, const uint32_t* w1) {
      scalar_t* o = data + begin;
      if (wide) {
        for (int64_t k = 0; k < n; ++k) o[k] = value(w0[k], w1[k]);
      } else {
        for (int64_t k = 0; k < n; ++k) o[k] = value(w0[k], 0u);
      }
    });
  });
  return self;
}

// ---- standard normal -------------------------------------------------------

// Box-Muller over each aligned block of 16: element j < 8 of a block is r cos(t), element j + 8
// is r sin(t), with r = sqrt(-2 log(1 - u[j])) and t = 2 pi u[j + 8]. In a last partial block,
// element i pairs its draw in subsequence 0 with its draw in subsequence 1 (float), or those of
// subsequences 0 and 1 with those of 2 and 3 (double).
void normalScalar(const uint32_t* w, float* o, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int j = 0; j < 8; ++j) {
      const float r = std::sqrt(-2.f * std::log(1.f - uniformFloat(w[16 * b + j])));
      const float t = 6.2831853071795864f * uniformFloat(w[16 * b + j + 8]);
      o[16 * b + j] = r * std::cos(t);
      o[16 * b + j + 8] = r * std::sin(t);
    }
  }
}

// PyTorch's own vectorized math (SLEEF, exported by libtorch_cpu), for processors with AVX2.
struct SleefFloat8Pair {
  __m256 x, y;
};
extern "C" {
__m256 Sleef_logf8_u10avx2(__m256);
SleefFloat8Pair Sleef_sincosf8_u10avx2(__m256);
}

__attribute__((target("avx2,fma"))) void normalAvx2(const uint32_t* w, float* o, int64_t blocks) {
  const __m256 scale = _mm256_set1_ps(0x1p-24f), one = _mm256_set1_ps(1.f), minus2 = _mm256_set1_ps(-2.f),
               two_pi = _mm256_set1_ps(6.2831853071795864f);
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * b));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * b + 8));
    const __m256 u1 = _mm256_sub_ps(one, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 8)), scale));
    const __m256 u2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 8)), scale);
    const __m256 r = _mm256_sqrt_ps(_mm256_mul_ps(minus2, Sleef_logf8_u10avx2(u1)));
    const SleefFloat8Pair sc = Sleef_sincosf8_u10avx2(_mm256_mul_ps(two_pi, u2));
    _mm256_storeu_ps(o + 16 * b, _mm256_mul_ps(r, sc.y));
    _mm256_storeu_ps(o + 16 * b + 8, _mm256_mul_ps(r, sc.x));
  }
  _mm256_zeroupper();
}

// Fills data[0, numel) with standard normal floats.
void standardNormal(float* data, int64_t numel, const PhiloxDraw& draw) {
  forChunks(draw, numel, /*wide=*/false, [&](int64_t begin, int64_t n, const uint32_t* w0, const uint32_t*) {
    const int64_t blocks = n / 16;
    if (kHaveAvx2) {
      normalAvx2(w0, data + begin, blocks);
    } else {
      normalScalar(w0, data + begin, blocks);
    }
    if (blocks * 16 < n) {  // the tensor's last, partial block
      const int64_t tail = blocks * 16;
      Words hi(n - tail);
      const uint32_t* w1 = hi.fill(draw, 1, begin + tail, n - tail);
      for (int64_t k = tail; k < n; ++k) {
        const float r = std::sqrt(-2.f * std::log(1.f - uniformFloat(w0[k])));
        data[begin + k] = r * std::cos(6.2831853071795864f * uniformFloat(w1[k - tail]));
      }
    }
  });
}

// The same in double precision, each uniform from 53 bits of both subsequences.
void standardNormal(double* data, int64_t numel, const PhiloxDraw& draw) {
  forChunks(draw, numel, /*wide=*/true, [&](int64_t begin, int64_t n, const uint32_t* w0, const uint32_t* w1) {
    double* o = data + begin;
    const int64_t blocks = n / 16;
    for (int64_t b = 0; b < blocks; ++b) {
      for (int j = 0; j < 8; ++j) {
        const int64_t i = 16 * b + j;
        const double r = std::sqrt(-2. * std::log(1. - uniformDouble(w0[i], w1[i])));
        const double t = 2. * M_PI * uniformDouble(w0[i + 8], w1[i + 8]);
        o[i] = r * std::cos(t);
        o[i + 8] = r * std::sin(t);
      }
    }
    if (blocks * 16 < n) {
      const int64_t tail = blocks * 16;
      Words w2(n - tail), w3(n - tail);
      const uint32_t* v0 = w2.fill(draw, 2, begin + tail, n - tail);
      const uint32_t* v1 = w3.fill(draw, 3, begin + tail, n - tail);
      for (int64_t k = tail; k < n; ++k) {
        const double r = std::sqrt(-2. * std::log(1. - uniformDouble(w0[k], w1[k])));
        o[k] = r * std::cos(2. * M_PI * uniformDouble(v0[k - tail], v1[k - tail]));
      }
    }
  });
}

// Raises PyTorch's usual error for an op not implemented for self's dtype: floating types, or
// (all_types) any but bool and complex.
void checkDtype(const at::Tensor& self, const char* name, bool all_types) {
  const auto dtype = self.scalar_type();
  const bool ok = all_types ? (at::isIntegralType(dtype, /*includeBool=*/false) || at::isFloatingType(dtype))
                            : at::isFloatingType(dtype);
  TORCH_CHECK_NOT_IMPLEMENTED(ok, "\"", name, "\" not implemented for '", c10::toString(dtype), "'");
}

struct Identity {
  template <typename T>
  T operator()(T z) const { return z; }
};

// self = transform(standard normal) elementwise, computed in float (double for double tensors).
template <typename Transform>
at::Tensor& normalLike(at::Tensor& self, const std::optional<at::Generator>& gen, const char* name,
                       const Transform& transform) {
  const int64_t numel = self.numel();
  checkDtype(self, name, /*all_types=*/false);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "normal", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    if (numel == 0) return;
    const PhiloxDraw draw = reservePhilox(gen, deviceOf(self), numel);
    produce<acc_t>(self, [&](acc_t* data) {
      standardNormal(data, numel, draw);
      if constexpr (std::is_same_v<Transform, Identity>) return;
      at::parallel_for(0, numel, kChunk * kSerialChunks, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) data[i] = transform(data[i]);
      });
    });
  });
  return self;
}

// ---- the ops -----------------------------------------------------------------

at::Tensor& uniform(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  if (self.is_complex()) {
    auto real = at::view_as_real(self);
    uniform(real, from, to, gen);
    return self;
  }
  checkDtype(self, "uniform_", /*all_types=*/false);
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
  TORCH_CHECK(std::isfinite(to - from), "uniform_ expects a finite range, but found from=", from, " and to=", to);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "uniform_", [&] {
    if constexpr (std::is_same_v<scalar_t, double>) {
      elementwise<double>(self, gen, true, [&](uint32_t a, uint32_t b) { return from + uniformDouble(a, b) * (to - from); });
    } else {
      const float f = static_cast<float>(from), range = static_cast<float>(to - from);
      elementwise<float>(self, gen, false, [&](uint32_t a, uint32_t) { return f + uniformFloat(a) * range; });
    }
  });
  return self;
}

at::Tensor& normal(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  if (self.is_complex()) {  // as the CPU: real and imaginary parts each with variance std^2 / 2
    auto real = at::view_as_real(self);
    normal(real, mean, std / std::sqrt(2.), gen);
    return self;
  }
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  if (mean == 0 && std == 1) return normalLike(self, gen, "normal_", Identity{});
  return normalLike(self, gen, "normal_", [mean, std](auto z) { return static_cast<decltype(z)>(z * std + mean); });
}

at::Tensor& logNormal(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  return normalLike(self, gen, "log_normal_",
                    [mean, std](auto z) { return static_cast<decltype(z)>(std::exp(z * std + mean)); });
}

// Elementwise ops of one uniform each, in float for 32-bit-or-narrower types, else double.
template <typename Value>
at::Tensor& fromUniform(at::Tensor& self, const std::optional<at::Generator>& gen, const char* name,
                        bool all_types, const Value& value) {
  auto run = [&](auto tag) {
    using scalar_t = decltype(tag);
    if constexpr (std::is_same_v<scalar_t, double> || std::is_same_v<scalar_t, int64_t>) {
      elementwise<scalar_t>(self, gen, true, [&](uint32_t a, uint32_t b) { return static_cast<scalar_t>(value(uniformDouble(a, b))); });
    } else {
      elementwise<float>(self, gen, false, [&](uint32_t a, uint32_t) { return static_cast<float>(value(static_cast<double>(uniformFloat(a)))); });
    }
  };
  checkDtype(self, name, all_types);
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, self.scalar_type(), "from_uniform", [&] { run(scalar_t{}); });
  return self;
}

at::Tensor& exponential(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "Exponential distribution is a continuous probability "
              "distribution. dtype must be a floating point but you specified ", self.scalar_type());
  TORCH_CHECK(lambd > 0 && !std::isinf(lambd) && !std::isnan(lambd),
              "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  return fromUniform(self, gen, "exponential_", false, [lambd](double u) { return -std::log1p(-u) / lambd; });
}

at::Tensor& geometric(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  const double denominator = std::log1p(-p);
  return fromUniform(self, gen, "geometric_", true,
                     [denominator](double u) { return std::ceil(std::log1p(-u) / denominator); });
}

at::Tensor& cauchy(at::Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "Cauchy distribution is a continuous probability "
              "distribution. dtype must be a floating point but you specified ", self.scalar_type());
  return fromUniform(self, gen, "cauchy_", false,
                     [median, sigma](double u) { return median + sigma * std::tan(M_PI * (u - 0.5)); });
}

// Values 0 or 1 of any dtype, 1 where the element's uniform is below its probability.
at::Tensor& bernoulliScalar(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, self.scalar_type(), "bernoulli_", [&] {
    const float pf = static_cast<float>(p);
    elementwise<scalar_t>(self, gen, false, [pf](uint32_t a, uint32_t) { return static_cast<scalar_t>(uniformFloat(a) < pf); });
  });
  return self;
}

at::Tensor& bernoulliTensor(at::Tensor& self, const at::Tensor& p, std::optional<at::Generator> gen) {
  const auto probabilities = p.device().type() == kNeuron ? hostView(p) : p;
  if (probabilities.numel() > 0) {
    const auto [low_t, high_t] = at::aminmax(probabilities.to(at::kDouble));
    const double low = low_t.item<double>(), high = high_t.item<double>();
    TORCH_CHECK(low >= 0 && high <= 1, "bernoulli_ expects all elements of p to be in [0, 1], but got p with values in [",
                low, ", ", high, "]");
  }
  auto uniforms = at::empty(self.sizes(), self.options().dtype(at::kFloat));
  elementwise<float>(uniforms, gen, false, [](uint32_t a, uint32_t) { return uniformFloat(a); });
  hostView(self).copy_(at::lt(hostView(uniforms), probabilities.expand(self.sizes())));
  return self;
}

// Integers as PyTorch's random_ gives them: from + (draw mod range), with a 64-bit draw when the
// range needs it; a range of 0 stands for all 2^64 values.
at::Tensor& randomRange(at::Tensor& self, int64_t from, uint64_t range, std::optional<at::Generator> gen) {
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, self.scalar_type(), "random_", [&] {
    if (range != 0 && (range & (range - 1)) == 0 && range > (uint64_t{1} << 32)) {  // a power of two: a mask
      const uint64_t mask = range - 1;
      elementwise<scalar_t>(self, gen, true, [from, mask](uint32_t a, uint32_t b) {
        return static_cast<scalar_t>(static_cast<int64_t>(static_cast<uint64_t>(from) + (word64(a, b) & mask)));
      });
    } else if (range == 0 || range > (uint64_t{1} << 32)) {
      elementwise<scalar_t>(self, gen, true, [from, range](uint32_t a, uint32_t b) {
        const uint64_t w = word64(a, b);
        return static_cast<scalar_t>(static_cast<int64_t>(static_cast<uint64_t>(from) + (range == 0 ? w : w % range)));
      });
    } else {
      elementwise<scalar_t>(self, gen, false, [from, range](uint32_t a, uint32_t) {
        return static_cast<scalar_t>(from + static_cast<int64_t>(a % range));
      });
    }
  });
  return self;
}

// The largest value random_ draws for self's dtype: 2^digits for floating types, else the maximum.
uint64_t randomMax(at::ScalarType dtype) {
  uint64_t top = 0;
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, dtype, "random_", [&] {
    if constexpr (std::is_same_v<scalar_t, bool>) {
      top = 1;
    } else if constexpr (std::is_floating_point_v<scalar_t> || std::is_same_v<scalar_t, at::Half> ||
                         std::is_same_v<scalar_t, at::BFloat16>) {
      top = uint64_t{1} << std::numeric_limits<scalar_t>::digits;
    } else {
      top = static_cast<uint64_t>(std::numeric_limits<scalar_t>::max());
    }
  });
  return top;
}

// PyTorch's bounds for random_'s from and to - 1.
void checkInRange(int64_t from, int64_t to_inclusive, at::ScalarType dtype) {
  const auto check = [&](double low, double high) {
    TORCH_CHECK(from >= low && from <= high, "from is out of bounds for ", dtype);
    TORCH_CHECK(to_inclusive >= low && to_inclusive <= high, "to - 1 is out of bounds for ", dtype);
  };
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, dtype, "random_", [&] {
    check(static_cast<double>(std::numeric_limits<scalar_t>::lowest()),
          static_cast<double>(std::numeric_limits<scalar_t>::max()));
  });
}

at::Tensor& random(at::Tensor& self, std::optional<at::Generator> gen) {
  return randomRange(self, 0, randomMax(self.scalar_type()) + 1, gen);
}

at::Tensor& randomTo(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < to, "random_ expects 'from' to be less than 'to', but got from=0 >= to=", to);
  checkInRange(0, to - 1, self.scalar_type());
  return randomRange(self, 0, static_cast<uint64_t>(to), gen);
}

at::Tensor& randomFrom(at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  if (to.has_value()) {
    TORCH_CHECK(from < *to, "random_ expects 'from' to be less than 'to', but got from=", from, " >= to=", *to);
    checkInRange(from, *to - 1, self.scalar_type());
  } else {
    checkInRange(from, from, self.scalar_type());
  }
  if (to.has_value()) return randomRange(self, from, static_cast<uint64_t>(*to) - static_cast<uint64_t>(from), gen);
  // Up to the dtype's largest value; all of int64 when from is its smallest (range 0: every value).
  return randomRange(self, from, randomMax(self.scalar_type()) - static_cast<uint64_t>(from) + 1, gen);
}

// A random permutation by PyTorch's CPU algorithm (swap i with i + draw mod (n - i)), with the
// i-th draw of the stream (64-bit when n exceeds 2^32).
at::Tensor& randperm(int64_t n, std::optional<at::Generator> gen, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "n must be non-negative, got", n);
  out.resize_({n});
  if (n == 0) return out;
  const PhiloxDraw draw = reservePhilox(gen, deviceOf(out), static_cast<uint64_t>(n));
  auto perm = at::arange(n, at::TensorOptions().dtype(at::kLong));
  auto* r = perm.data_ptr<int64_t>();
  const bool wide = static_cast<uint64_t>(n) > (uint64_t{1} << 32);  // else 32-bit draws
  Words lo(std::min(kChunk, n)), hi(wide ? kChunk : 0);
  for (int64_t begin = 0; begin < n - 1; begin += kChunk) {
    const int64_t len = std::min(kChunk, n - 1 - begin);
    const uint32_t* w0 = lo.fill(draw, 0, begin, len);
    if (wide) {
      const uint32_t* w1 = hi.fill(draw, 1, begin, len);
      for (int64_t k = 0; k < len; ++k) {
        const int64_t i = begin + k;
        std::swap(r[i], r[i + static_cast<int64_t>(word64(w0[k], w1[k]) % static_cast<uint64_t>(n - i))]);
      }
    } else {
      for (int64_t k = 0; k < len; ++k) {
        const int64_t i = begin + k;
        std::swap(r[i], r[i + static_cast<int64_t>(w0[k] % static_cast<uint32_t>(n - i))]);
      }
    }
  }
  hostView(out).copy_(perm);
  return out;
}

// Dropout in one pass: mask[i] = u[i] < 1 - p, out[i] = x[i] * mask[i] / (1 - p).
std::tuple<at::Tensor, at::Tensor> nativeDropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(0 <= p && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  auto mask = at::empty(input.sizes(), input.options().dtype(at::kBool));
  if (input.numel() == 0) return {input.clone(), mask};
  if (train.has_value() && !*train) {
    mask.fill_(true);
    return {input.clone(), mask};
  }
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;
  if (input.scalar_type() != at::kFloat || !input.is_contiguous()) {
    bernoulliScalar(mask, keep, std::nullopt);
    return {input.mul(mask).mul_(scale), mask};
  }
  auto output = at::empty(input.sizes(), input.options());
  const auto x = hostView(input), y = hostView(output), m = hostView(mask);
  const float* xs = x.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  bool* ms = m.data_ptr<bool>();
  const float keep_f = static_cast<float>(keep), scale_f = static_cast<float>(scale);
  const PhiloxDraw draw = reservePhilox(std::nullopt, deviceOf(input), input.numel());
  forChunks(draw, input.numel(), false, [&](int64_t begin, int64_t n, const uint32_t* w, const uint32_t*) {
    for (int64_t k = 0; k < n; ++k) {
      const bool kept = uniformFloat(w[k]) < keep_f;
      ms[begin + k] = kept;
      ys[begin + k] = kept ? xs[begin + k] * scale_f : 0.f;
    }
  });
  return {output, mask};
}

}  // namespace

// The kernels' names in activity records.
constexpr char kUniformName[] = "uniform_";
constexpr char kNormalName[] = "normal_";
constexpr char kLogNormalName[] = "log_normal_";
constexpr char kExponentialName[] = "exponential_";
constexpr char kGeometricName[] = "geometric_";
constexpr char kCauchyName[] = "cauchy_";
constexpr char kBernoulliName[] = "bernoulli_";
constexpr char kRandomName[] = "random_";
constexpr char kRandpermName[] = "randperm";
constexpr char kNativeDropoutName[] = "native_dropout";

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("uniform_", TORCH_FN((Launched<kUniformName, &uniform>::call)));
  m.impl("normal_", TORCH_FN((Launched<kNormalName, &normal>::call)));
  m.impl("log_normal_", TORCH_FN((Launched<kLogNormalName, &logNormal>::call)));
  m.impl("exponential_", TORCH_FN((Launched<kExponentialName, &exponential>::call)));
  m.impl("geometric_", TORCH_FN((Launched<kGeometricName, &geometric>::call)));
  m.impl("cauchy_", TORCH_FN((Launched<kCauchyName, &cauchy>::call)));
  m.impl("bernoulli_.float", TORCH_FN((Launched<kBernoulliName, &bernoulliScalar>::call)));
  m.impl("bernoulli_.Tensor", TORCH_FN((Launched<kBernoulliName, &bernoulliTensor>::call)));
  m.impl("random_", TORCH_FN((Launched<kRandomName, &random>::call)));
  m.impl("random_.to", TORCH_FN((Launched<kRandomName, &randomTo>::call)));
  m.impl("random_.from", TORCH_FN((Launched<kRandomName, &randomFrom>::call)));
  m.impl("randperm.generator_out", TORCH_FN((Launched<kRandpermName, &randperm>::call)));
  m.impl("native_dropout", TORCH_FN((Launched<kNativeDropoutName, &nativeDropout>::call)));
}

}  // namespace torchneuron
