// Mamba-2 ("mamba2": state-spaces/mamba2-*, Mamba-Codestral): state-space layers with a scalar
// decay per head and B/C shared by groups of heads, run by models/mamba2.cpp; a fixed-size state
// per sequence instead of a KV cache.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchMamba2 = [] {
  ArchSpec s{"mamba2", "Mamba-2"};
  s.stack = LayerStack::Mamba2;
  return s;
}();

}  // namespace tern
