// Fuzzes the layer store's archive path (src/storage/image.cc, AddLayerFromBlob: a registry's or
// image's layer blob, tar or gzip or zstd, read by the safety checks of storage/cache.h's Extract)
// with a temporary template store and database. Each input is the blob; its diff_id is computed
// from the decompressed stream as a registry would give it, so that the unpacking runs to the
// end and commits (half the inputs also have their blob digest checked). Checks that nothing
// appears in the work directory but the store's own entries (a canary directory beside the store
// stays empty: no entry escaped), that staging is empty afterwards, that the layer directory is
// the only one made, and that gc removes it. Regressions go to src/storage/image_test.cc.
#include <archive.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include "storage/image.h"
#include "storage/template.h"
#include "store/store.h"

namespace {

namespace fs = std::filesystem;
constexpr int64_t kCacheBytes = 4 << 20;
constexpr size_t kMaxStream = 16 << 20;

struct World {
  std::string work, outside;
  sbx::storage::TemplateStore ts;
  std::unique_ptr<sbx::store::Store> st;
};

// Never destroyed: the exit handler that removes it runs after static destructors would have.
World& Get() {
  static World* w = [] {
    std::string base = fs::exists("/dev/shm") ? "/dev/shm" : fs::temp_directory_path().string();
    auto* x = new World;
    x->work = base + "/sbx-fuzz-layer-" + std::to_string(getpid());
    fs::remove_all(x->work);
    fs::create_directories(x->work + "/outside");
    x->outside = x->work + "/outside";
    x->ts.dir = x->work + "/templates";
    x->ts.cache_bytes = kCacheBytes;
    auto st = sbx::store::Store::Open(x->work + "/sbx.db");
    if (!st.ok()) __builtin_trap();
    x->st = std::move(*st);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(Get().work, ec);
    });
    return x;
  }();
  return *w;
}

std::string Hex(const unsigned char* d, unsigned n) {
  static const char* k = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += k[d[i] >> 4];
    out += k[d[i] & 15];
  }
  return out;
}

std::string Sha256(const uint8_t* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(data, size, md, &n, EVP_sha256(), nullptr);
  return Hex(md, n);
}

// sha256 of the decompressed stream (any filter libarchive has, or none), or "" past kMaxStream
// or when it does not decompress.
std::string DiffId(const uint8_t* data, size_t size) {
  archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_raw(a);
  std::string out;
  archive_entry* e = nullptr;
  if (archive_read_open_memory(a, data, size) == ARCHIVE_OK &&
      archive_read_next_header(a, &e) == ARCHIVE_OK) {
    EVP_MD_CTX* c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), nullptr);
    char buf[65536];
    size_t total = 0;
    la_ssize_t n;
    while ((n = archive_read_data(a, buf, sizeof buf)) > 0 && total <= kMaxStream) {
      EVP_DigestUpdate(c, buf, static_cast<size_t>(n));
      total += static_cast<size_t>(n);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    if (n == 0 && total <= kMaxStream) out = Hex(md, len);
  }
  archive_read_free(a);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = Get();
  const std::string blob = w.work + "/blob";
  if (FILE* f = std::fopen(blob.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    __builtin_trap();
  }
  std::string diff = DiffId(data, size);
  if (diff.empty()) diff = std::string(64, '0');
  std::string digest = size > 0 && (data[size - 1] & 1) ? "sha256:" + Sha256(data, size) : "";
  auto layer = sbx::storage::AddLayerFromBlob(w.ts, *w.st, blob, digest, "sha256:" + diff, "");
  if (layer.ok() && layer->size_bytes > kCacheBytes) __builtin_trap();

  // Only the store's own entries, and an empty canary directory.
  static const std::set<std::string> kWork = {"blob",   "outside",    "templates",
                                              "sbx.db", "sbx.db-wal", "sbx.db-shm"};
  for (const auto& e : fs::directory_iterator(w.work))
    if (!kWork.count(e.path().filename().string())) __builtin_trap();
  if (!fs::is_empty(w.outside)) __builtin_trap();
  static const std::set<std::string> kStore = {".lock", "layers", "staging", "leases"};
  for (const auto& e : fs::directory_iterator(w.ts.dir))
    if (!kStore.count(e.path().filename().string())) __builtin_trap();
  if (!fs::is_empty(w.ts.dir + "/staging")) __builtin_trap();
  size_t layers = 0;
  for (const auto& e : fs::directory_iterator(w.ts.dir + "/layers")) {
    ++layers;
    if (!layer.ok() || e.path().filename().string() != layer->id) __builtin_trap();
  }
  if (layers > 1) __builtin_trap();
  // The layer is nobody's (no pin, no template): gc takes it, and the cache is empty again.
  auto gc = sbx::storage::GcLayers(w.ts, *w.st);
  if (!gc.ok()) __builtin_trap();
  if (!fs::is_empty(w.ts.dir + "/layers")) __builtin_trap();
  return 0;
}
