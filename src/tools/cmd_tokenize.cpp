#include "core/error.h"
#include "tools/commands.h"

namespace tern {

int cmd_tokenize(int, char**) { fail("'tokenize' is not implemented yet"); }

}  // namespace tern
