// Mamba ("mamba", Mamba-1: state-spaces/mamba-*, FalconMamba): selective state-space layers in
// place of attention and FFN, run by the state-space stack (models/mamba.cpp); a fixed-size
// state per sequence instead of a KV cache.
#include "models/arch.h"

namespace tern {

const ArchSpec kArchMamba = [] {
  ArchSpec s{"mamba", "Mamba / FalconMamba"};
  s.stack = LayerStack::Mamba;
  return s;
}();

}  // namespace tern
