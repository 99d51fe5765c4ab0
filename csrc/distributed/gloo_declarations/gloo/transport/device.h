// See gloo_declarations/README.md: declared only.
#pragma once

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
