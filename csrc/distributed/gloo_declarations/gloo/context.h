// See gloo_declarations/README.md: declared only. ProcessGroupGloo::setTimeout (an inline virtual
// function, compiled in libtorch) names Context::setTimeout.
#pragma once

#include <chrono>

namespace gloo {

class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

}  // namespace gloo
