// Little-endian integers in byte buffers: the wire formats of both transports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace fuselink::fabric {

template <typename T>
void PutLe(std::span<uint8_t> out, size_t at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out[at + i] = static_cast<uint8_t>(value >> (8 * i));
}

template <typename T>
T GetLe(std::span<const uint8_t> in, size_t at) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<T>(in[at + i]) << (8 * i));
  }
  return value;
}

}  // namespace fuselink::fabric
