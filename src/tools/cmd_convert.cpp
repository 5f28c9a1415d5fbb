#include "core/error.h"
#include "tools/commands.h"

namespace tern {

int cmd_convert(int, char**) { fail("'convert' is not implemented yet"); }

}  // namespace tern
