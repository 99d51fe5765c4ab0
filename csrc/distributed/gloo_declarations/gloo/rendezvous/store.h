// See gloo_declarations/README.md. ProcessGroupGloo::GlooStore derives from this class and overrides
// these four functions (GLOO_STORE_HAS_STORE_V2 stays undefined); the class is never instantiated
// outside libtorch.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};

}  // namespace gloo::rendezvous
