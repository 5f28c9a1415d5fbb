// RWKV-6 "Finch" ("rwkv6": RWKV-6-World, RWKV/v6-Finch-*-HF): an attention-free recurrent model
// (time mix with data-dependent token shift and decay, the WKV-6 state per head; channel mix),
// run by models/rwkv6.cpp; a fixed-size state per sequence instead of a KV cache.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchRwkv6 = [] {
  ArchSpec s{"rwkv6", "RWKV-6"};
  s.stack = LayerStack::Rwkv6;
  return s;
}();

}  // namespace tern
