#include "core/error.h"
#include "tools/commands.h"

namespace tern {

int cmd_inspect(int, char**) { fail("'inspect' is not implemented yet"); }

}  // namespace tern
