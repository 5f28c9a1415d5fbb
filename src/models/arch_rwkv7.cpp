// RWKV-7 "Goose" ("rwkv7": RWKV7-Goose-World, fla-hub/rwkv7-*): an attention-free recurrent
// model (time mix with the WKV-7 state per head, channel mix), run by models/rwkv7.cpp; a
// fixed-size state per sequence instead of a KV cache.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchRwkv7 = [] {
  ArchSpec s{"rwkv7", "RWKV-7"};
  s.stack = LayerStack::Rwkv7;
  return s;
}();

}  // namespace tern
