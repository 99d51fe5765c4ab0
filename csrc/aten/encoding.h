// One encoding of a boxed op's arguments as integers, shared by the two keys made of them: the meta
// cache's (deferred.cpp: an op and its arguments' layouts, whose meta kernel's answer is kept) and a
// fused group's signature (csrc/fused/fused.cpp: its ops and their arguments, whose compiled graph is kept).
//
// Each value starts with its Token; what follows it is the token's payload. The two keys differ
// only where they must: what a device tensor's `place` counts, a CPU scalar's payload, and whether
// a float's value is part of the key.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>
#include <vector>

namespace torchneuron {

enum class Token : int64_t {
  ArgumentsEnd = -1,  // ends an op's arguments in a group's signature (its results follow)
  ResultsEnd = -2,    // ends an op's results
  GroupEnd = -3,      // ends a group's ops (the device and the storages' liveness follow)
  Tensor = 1,         // a device tensor: place, dtype, dim, sizes, strides, offset, conj*2+neg
  CpuScalar = 2,      // a 0-dim CPU tensor: dtype, then the meta key's is-wrapped-number or the group's value bits
  Undefined = 3,      // an undefined tensor
  Scratch = 4,        // a tensor a meta kernel made of no device storage (a group cannot compile it)
  None = 5,
  Integer = 6,        // a bool or int: its value
  Float = 7,          // a float: its bits, when its value is part of the key
  String = 8,         // its hash
  Device = 9,         // type * 1024 + index
  List = 10,          // its length, then its elements
  Other = 11,         // anything else (a tuple, a complex number): its tag's length
  LiftedTensorFloat = 12,  // a Python float wrapped as a tensor, an input of the group's graph: no payload
  LiftedFloat = 13,        // a Scalar float argument, an input of the group's graph: no payload
};

// A key made of tokens and their payloads.
class TokenWriter {
 public:
  explicit TokenWriter(std::vector<int64_t>& out) : out_(out) {}

  void token(Token t) { out_.push_back(static_cast<int64_t>(t)); }
  template <class... V>
  void token(Token t, V... payload) {
    token(t);
    (out_.push_back(static_cast<int64_t>(payload)), ...);
  }
  void raw(int64_t v) { out_.push_back(v); }

  static int64_t floatBits(double v) {
    int64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
  }

  // A device tensor, `place` saying where its storage is among the key's storages.
  void tensor(int64_t place, const at::Tensor& t) {
    token(Token::Tensor, place, static_cast<int64_t>(t.scalar_type()), t.dim());
    for (auto v : t.sizes()) raw(v);
    for (auto v : t.strides()) raw(v);
    raw(t.storage_offset());
    raw(int64_t(t.is_conj()) * 2 + int64_t(t.is_neg()));
  }

  // A value that is neither a tensor nor a list: false, with nothing written, when it has no token
  // but Other. `float_value`: a float's value is part of the key.
  bool value(const c10::IValue& iv, bool float_value) {
    if (iv.isNone()) return token(Token::None), true;
    if (iv.isBool() || iv.isInt()) return token(Token::Integer, iv.isBool() ? int64_t(iv.toBool()) : iv.toInt()), true;
    if (iv.isDouble()) {
      token(Token::Float);
      if (float_value) raw(floatBits(iv.toDouble()));
      return true;
    }
    if (iv.isString()) return token(Token::String, std::hash<std::string_view>()(iv.toStringView())), true;
    if (iv.isDevice())
      return token(Token::Device, static_cast<int64_t>(iv.toDevice().type()) * 1024 + iv.toDevice().index()), true;
    return false;
  }

  // A list: its length, then each element through `element` (which returns false to give up).
  template <class Element>
  bool list(const c10::IValue& iv, Element&& element) {
    const auto elements = iv.toListRef();
    token(Token::List, elements.size());
    for (const auto& e : elements)
      if (!element(e)) return false;
    return true;
  }

 private:
  std::vector<int64_t>& out_;
};

// The hash of a key of tokens: the meta cache's, and a fused group's signature.
struct TokensHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    size_t h = v.size();
    for (int64_t x : v) h ^= std::hash<int64_t>()(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

}  // namespace torchneuron
