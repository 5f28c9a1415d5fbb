#include "core/error.h"
#include "tools/commands.h"

namespace tern {

int cmd_run(int, char**) { fail("'run' is not implemented yet"); }

}  // namespace tern
