#include "sandbox/id_pool.h"

#include <cerrno>
#include <cstdlib>

#include "common/fd.h"

namespace sbx::sandbox {
namespace {
constexpr uint64_t kRange = 65536;
}

Result<std::unique_ptr<StoreIdPool>> StoreIdPool::Make(store::Store& store, IdPoolConfig config,
                                                       uint32_t reserved_base) {
  const uint64_t begin = config.base;
  const uint64_t end = begin + uint64_t{config.slots} * kRange;
  std::string what = "id pool " + std::to_string(begin) + " + " + std::to_string(config.slots) +
                     " ranges of 65536";
  if (config.slots == 0 || begin == 0) return Status::Error(what + ": empty", EINVAL);
  // uid 2^32 - 1 is the kernel's "no id".
  if (end > UINT32_MAX) return Status::Error(what + ": ends past host id 4294967294", EINVAL);
  if (begin < uint64_t{reserved_base} + kRange && uint64_t{reserved_base} < end)
    return Status::Error(what + ": overlaps the shared range at " + std::to_string(reserved_base),
                         EINVAL);
  return std::unique_ptr<StoreIdPool>(new StoreIdPool(store, config));
}

Result<uint32_t> StoreIdPool::Acquire(const std::string& box_id) {
  auto slot = store_.AcquireIdSlot(box_id, config_.slots);
  if (!slot.ok()) return slot.status();
  return static_cast<uint32_t>(config_.base + static_cast<uint64_t>(*slot) * kRange);
}

Status StoreIdPool::Release(const std::string& box_id) { return store_.ReleaseIdSlot(box_id); }

Result<std::vector<std::string>> StoreIdPool::Holders() {
  auto slots = store_.ListIdSlots();
  if (!slots.ok()) return slots.status();
  std::vector<std::string> out;
  for (const auto& s : *slots) out.push_back(s.box_id);
  return out;
}

Result<IdPoolConfig> LoadIdPoolConfig(const std::string& data_dir) {
  IdPoolConfig c;
  auto text = ReadFile(data_dir + "/id-pool", 256);
  if (!text.ok()) {
    if (text.status().err() == ENOENT) return c;
    return text.status();
  }
  char* end = nullptr;
  unsigned long long base = std::strtoull(text->c_str(), &end, 10);
  unsigned long long slots = std::strtoull(end, nullptr, 10);
  if (base == 0 || base > UINT32_MAX || slots == 0 || slots > UINT32_MAX)
    return Status::Error(data_dir + "/id-pool: malformed", EINVAL);
  c.base = static_cast<uint32_t>(base);
  c.slots = static_cast<uint32_t>(slots);
  return c;
}

Status SaveIdPoolConfig(const std::string& data_dir, const IdPoolConfig& config) {
  return WriteFileAtomic(data_dir + "/id-pool",
                         std::to_string(config.base) + " " + std::to_string(config.slots) + "\n",
                         0600);
}

}  // namespace sbx::sandbox
