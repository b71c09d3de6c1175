// Fuzzes tar template unpacking (src/storage/template, UnpackTarball: what `sbx template add`
// does with a tarball, every compression libarchive reads included): each input is written to a
// file and unpacked into a fresh directory with a 1 MiB bound, which is removed after each run.
// Checks that nothing appears next to that directory (no entry escaped it) and that a success
// stays within the bound. Regressions go to src/storage/template_test.cc.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "storage/template.h"

namespace {

namespace fs = std::filesystem;
constexpr int64_t kLimit = 1 << 20;

// Never destroyed: the exit handler that removes it runs after static destructors would have.
const std::string& WorkDir() {
  static const std::string* dir = [] {
    std::string base = fs::exists("/dev/shm") ? "/dev/shm" : fs::temp_directory_path().string();
    auto* d = new std::string(base + "/sbx-fuzz-tar-" + std::to_string(getpid()));
    fs::remove_all(*d);
    fs::create_directories(*d + "/box");
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(WorkDir(), ec);
    });
    return d;
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& work = WorkDir();
  const std::string tarball = work + "/in.tar";
  const std::string dest = work + "/box/root";
  if (FILE* f = std::fopen(tarball.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    __builtin_trap();
  }
  fs::create_directory(dest);
  auto n = sbx::storage::UnpackTarball(tarball, dest, kLimit);
  if (n.ok() && *n > kLimit) __builtin_trap();
  // Only `root` may exist in box/, and box/ and in.tar in the work directory: anything else
  // escaped the destination.
  for (const auto& e : fs::directory_iterator(work + "/box"))
    if (e.path().filename() != "root") __builtin_trap();
  for (const auto& e : fs::directory_iterator(work))
    if (e.path().filename() != "box" && e.path().filename() != "in.tar") __builtin_trap();
  std::error_code ec;
  fs::permissions(dest, fs::perms::owner_all, fs::perm_options::add, ec);
  fs::remove_all(dest, ec);
  if (ec || fs::exists(fs::symlink_status(dest))) __builtin_trap();
  return 0;
}
