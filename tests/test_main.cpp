#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "core/fsutil.h"

int main(int argc, char** argv) {
  ptq::tune_allocator();
  return Catch::Session().run(argc, argv);
}
