#include "tools/commands.h"

int main(int argc, char** argv) { return tern::tern_main(argc, argv); }
