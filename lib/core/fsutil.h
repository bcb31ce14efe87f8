// fsutil.h — files that are never left half-written: atomic file writes, staging folders that
// become the output only when complete, read-only mappings, SHA-256 of files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ptq {

// Keeps freed memory in the process (glibc mallopt): activation buffers are large and
// short-lived, and returning them to the kernel makes every layer page-fault and zero them again.
// Called once by main() and by the test runner.
void tune_allocator();

// Asks the kernel to back the whole 2 MiB pages inside [p, p + n) with transparent huge pages,
// where it gives them on request (THP "madvise", Debian's and Ubuntu's default; "always" needs no
// asking, "never" ignores it). Call before the first touch: a fresh 1 GB fp64 matrix then faults
// in 512 pieces, not 262,144 (on the 2-core VM: gptq_quantize of a 4096 x 11008 Linear 21.5 ->
// 18.3 s, 3 GB of fresh matrices). Only the solve's cols^2 matrices and the Hessian's accumulator
// ask: smaller buffers are reused from the heap (tune_allocator) and gain less.
void advise_huge_pages(void* p, size_t n);

std::string read_text_file(const std::string& path);          // whole file; Errc::io naming it
// Writes to "<path>.tmp-<pid>", fsyncs, renames over `path`.
void write_file_atomic(const std::string& path, std::string_view data);
// Lowercase hex; `read`, where given, is told the bytes read so far after each MiB (progress).
std::string sha256_file(const std::string& path, const std::function<void(size_t)>& read = {});
std::string human_bytes(double bytes);                        // "462 B", "1.50 MiB" (powers of 1024)
// The bytes an unprivileged writer may still put on the file system that holds `path` (its nearest
// existing ancestor where it does not exist yet: statvfs's f_bavail), and that file system's id.
struct FreeSpace {
  int64_t bytes = 0;
  uint64_t fs_id = 0;
};
FreeSpace free_space(const std::string& path);
std::string sha256_bytes(std::string_view data);

// A read-only private mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the pages of [p, p+n) from this process's resident set (they are re-read if touched).
  void release(const uint8_t* p, size_t n) const;
 private:
  std::string path_;
  uint8_t* data_{nullptr};
  size_t size_{0};
};

// An output folder built under "<final>.partial" and renamed to <final> by commit().
// Refuses an existing <final> unless `force`, and a staging folder another live run holds (flock).
// `resume`: keep what an earlier, killed run left in the staging folder; otherwise start it empty.
// If never committed (an error), the staging folder is removed unless `keep_on_failure`; a killed
// run leaves only the ".partial" folder, which never looks like a finished output.
class OutputDir {
 public:
  OutputDir(std::string final_path, bool force, bool resume = false, bool keep_on_failure = false);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;
  const std::string& path() const { return staging_; }         // write here
  static std::string staging_of(std::string final_path);         // path() of an OutputDir(final_path)
  // The constructor's first check, alone (`quantize --dry-run`): an existing output without --force.
  static void refuse_existing(std::string final_path, bool force);
  const std::string& final_path() const { return final_; }
  std::string file(const std::string& name) const { return staging_ + "/" + name; }
  void commit();
 private:
  std::string final_, staging_;
  bool force_{false}, committed_{false}, keep_{false};
  int lock_fd_{-1};
};

}  // namespace ptq
