#include "core/fsutil.h"

#include <fcntl.h>
#include <malloc.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;

namespace ptq {

namespace {
std::string errno_str() { return std::strerror(errno); }

void fsync_dir(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) { ::fsync(fd); ::close(fd); }
}

std::string hex(const unsigned char* d, unsigned n) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) { s += k[d[i] >> 4]; s += k[d[i] & 15]; }
  return s;
}

struct EvpCtx {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EvpCtx() { EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr); }
  ~EvpCtx() { EVP_MD_CTX_free(ctx); }
  void update(const void* p, size_t n) { EVP_DigestUpdate(ctx, p, n); }
  std::string final() {
    unsigned char d[EVP_MAX_MD_SIZE]; unsigned n = 0;
    EVP_DigestFinal_ex(ctx, d, &n);
    return hex(d, n);
  }
};
}  // namespace

void tune_allocator() {
  // No mmap'd chunks at all (glibc caps M_MMAP_THRESHOLD at 32 MiB, and a 7B layer's matrices are
  // 45-180 MB): every block comes from the heap and, with trimming off, freed blocks are reused
  // instead of being unmapped and faulted in again (first touch costs ~3 us per 4 KiB page on our
  // VMs: a 7B layer's fresh buffers took seconds).
  // One arena for every thread: a thread arena cannot grow past 64 MiB, so glibc mmaps a big block
  // a background thread allocates (the next layer's weights) anyway, and the main thread's free
  // unmaps it again (measured ~30 ms per 7B layer on the GPU machine, and the reader faults it all
  // back in). The threads that allocate big blocks are few; contention is not measurable.
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);   // ~2 GiB (an int): a 7B layer's fp32 weights are 0.8 GB
}

void advise_huge_pages(void* p, size_t n) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + n;
  a = (a + kHuge - 1) / kHuge * kHuge;
  b = b / kHuge * kHuge;
  if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);   // advice: a failure changes nothing
#else
  (void)p, (void)n;
#endif
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(Errc::io, path, "", "cannot open for reading: " + errno_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail(Errc::io, path, "", "read error");
  return ss.str();
}

void write_file_atomic(const std::string& path, std::string_view data) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(Errc::io, path, "", "cannot create: " + errno_str());
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      std::string e = errno_str();
      ::close(fd); ::unlink(tmp.c_str());
      fail(Errc::io, path, "", "write failed: " + e);
    }
    off += size_t(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string e = errno_str();
    ::unlink(tmp.c_str());
    fail(Errc::io, path, "", "fsync/close failed: " + e);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string e = errno_str();
    ::unlink(tmp.c_str());
    fail(Errc::io, path, "", "rename failed: " + e);
  }
  fsync_dir(path);
}

std::string human_bytes(double b) {
  char s[32];
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) { b /= 1024; ++i; }
  std::snprintf(s, sizeof s, i ? "%.2f %s" : "%.0f %s", b, u[i]);
  return s;
}

FreeSpace free_space(const std::string& path) {
  std::filesystem::path p = std::filesystem::absolute(path);
  std::error_code ec;
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  struct statvfs v {};
  if (::statvfs(p.c_str(), &v) != 0) fail(Errc::io, p.string(), "", std::string("cannot read the file system's free space: ") + std::strerror(errno));
  return {int64_t(v.f_bavail) * int64_t(v.f_frsize), uint64_t(v.f_fsid)};
}

std::string sha256_bytes(std::string_view data) {
  EvpCtx c;
  c.update(data.data(), data.size());
  return c.final();
}

std::string sha256_file(const std::string& path, const std::function<void(size_t)>& read) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(Errc::io, path, "", "cannot open for reading: " + errno_str());
  EvpCtx c;
  std::vector<char> buf(1 << 20);
  size_t n = 0;
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    c.update(buf.data(), size_t(f.gcount()));
    n += size_t(f.gcount());
    if (read) read(n);
  }
  if (f.bad()) fail(Errc::io, path, "", "read failed after " + std::to_string(n) + " bytes: " + errno_str());
  return c.final();
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(Errc::io, path, "", "cannot open: " + errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0) { ::close(fd); fail(Errc::io, path, "", "cannot stat: " + errno_str()); }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) { ::close(fd); fail(Errc::io, path, "", "mmap failed: " + errno_str()); }
    data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void MappedFile::release(const uint8_t* p, size_t n) const {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + n;
  a = (a + page - 1) / page * page;    // only whole pages inside the range
  b = b / page * page;
  if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

std::string OutputDir::staging_of(std::string final_path) {
  while (final_path.size() > 1 && final_path.back() == '/') final_path.pop_back();
  return final_path + ".partial";
}

void OutputDir::refuse_existing(std::string final_path, bool force) {
  while (final_path.size() > 1 && final_path.back() == '/') final_path.pop_back();
  std::error_code ec;
  if (fs::exists(final_path, ec) && !force) fail(Errc::exists, final_path, "", "output exists; pass --force to replace it");
}

OutputDir::OutputDir(std::string final_path, bool force, bool resume, bool keep_on_failure)
    : final_(std::move(final_path)), force_(force), keep_(keep_on_failure) {
  while (final_.size() > 1 && final_.back() == '/') final_.pop_back();
  refuse_existing(final_, force_);
  std::error_code ec;
  staging_ = staging_of(final_);
  // The parent folders are made as `mkdir -p` would (an output under a new runs/ folder).
  if (const fs::path parent = fs::path(final_).parent_path(); !parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) fail(Errc::io, parent.string(), "", "cannot create the output's parent folder: " + ec.message());
  }
  // The lock lives beside the staging folder, so that clearing the folder keeps it.
  const std::string lock = final_ + ".partial.lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
  if (lock_fd_ < 0) fail(Errc::io, lock, "", std::string("cannot create the lock file: ") + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    fail(Errc::exists, final_, "", "another ptqkit run is writing this output (" + staging_ + " is locked)");
  }
  if (!resume) fs::remove_all(staging_, ec);
  fs::create_directories(staging_, ec);
  if (ec) fail(Errc::io, staging_, "", "cannot create output folder: " + ec.message());
}

OutputDir::~OutputDir() {
  std::error_code ec;
  if (!committed_ && !keep_) fs::remove_all(staging_, ec);
  if (lock_fd_ >= 0) {
    fs::remove(final_ + ".partial.lock", ec);
    ::close(lock_fd_);
  }
}

void OutputDir::commit() {
  std::error_code ec;
  std::string old;
  if (fs::exists(final_, ec)) {
    if (!force_) fail(Errc::exists, final_, "", "output appeared while running; pass --force to replace it");
    old = final_ + ".old-" + std::to_string(::getpid());
    fs::rename(final_, old, ec);
    if (ec) fail(Errc::io, final_, "", "cannot move the existing output aside: " + ec.message());
  }
  fs::rename(staging_, final_, ec);
  if (ec) fail(Errc::io, final_, "", "cannot rename the finished output into place: " + ec.message());
  committed_ = true;
  fsync_dir(final_);
  if (!old.empty()) fs::remove_all(old, ec);
}

}  // namespace ptq
