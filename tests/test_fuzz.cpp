// Replays the fuzz seed corpora and every input that once crashed a fuzz target
// (fuzz/regressions/<target>/) through the same target functions, in the regular build: each must
// end in success or a ptq::Error, never another exception or a crash.
#include <filesystem>

#include "core/fsutil.h"
#include "targets.h"
#include "testing.h"

namespace fs = std::filesystem;

TEST_CASE("fuzz regressions and seed corpora replay cleanly") {
  int replayed = 0;
  for (const char* kind : {"corpus", "regressions"})
    for (auto& t : ptqfuzz::all_targets()) {
      const fs::path dir = fs::path(PTQKIT_SOURCE_DIR) / "fuzz" / kind / t.name;
      if (!fs::exists(dir)) continue;
      for (auto& e : fs::directory_iterator(dir)) {
        if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
        const std::string bytes = ptq::read_text_file(e.path().string());
        INFO(t.name << ": " << e.path().string());
        CHECK_NOTHROW(t.fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
        ++replayed;
      }
    }
  CHECK(replayed >= 20);
}
