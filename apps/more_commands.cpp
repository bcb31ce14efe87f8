#include "commands.h"

namespace ptq {
void register_more_commands(CLI::App&) {}
int run_more_commands(CLI::App&) { return 0; }
}  // namespace ptq
