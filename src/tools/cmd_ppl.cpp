#include "core/error.h"
#include "tools/commands.h"

namespace tern {

int cmd_ppl(int, char**) { fail("'ppl' is not implemented yet"); }

}  // namespace tern
