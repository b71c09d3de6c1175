// BoxRegistry (box_net.h): the boxes the resolver and the proxy decide for, by address and id.
#include "network/box_net.h"

namespace sbx::network {
namespace {

// A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d; the registry keys the IPv4 form.
address Key(const address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
  return a;
}

std::vector<address> Addresses(const BoxNet& box) {
  std::vector<address> out{Key(box.box_ip)};
  if (!box.box_ip6.is_unspecified()) out.push_back(box.box_ip6);
  return out;
}

}  // namespace

void BoxRegistry::Put(std::shared_ptr<const BoxNet> box) {
  if (!box) return;
  MutexLock lock(mu_);
  auto old = by_id_.find(box->id);
  if (old != by_id_.end()) Unmap(*old->second);
  for (const address& a : Addresses(*box)) by_address_[a] = box;
  by_id_[box->id] = std::move(box);
}

void BoxRegistry::Remove(const std::string& id) {
  MutexLock lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  Unmap(*it->second);
  by_id_.erase(it);
}

void BoxRegistry::Unmap(const BoxNet& box) {
  // Only this box's own mappings: an address reused by a newer box stays that box's.
  for (const address& a : Addresses(box)) {
    auto at = by_address_.find(a);
    if (at != by_address_.end() && at->second->id == box.id) by_address_.erase(at);
  }
}

std::shared_ptr<const BoxNet> BoxRegistry::ByAddress(const address& box_ip) const {
  MutexLock lock(mu_);
  auto it = by_address_.find(Key(box_ip));
  return it == by_address_.end() ? nullptr : it->second;
}

std::shared_ptr<const BoxNet> BoxRegistry::ById(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const BoxNet>> BoxRegistry::All() const {
  MutexLock lock(mu_);
  std::vector<std::shared_ptr<const BoxNet>> out;
  out.reserve(by_id_.size());
  for (const auto& [id, box] : by_id_) out.push_back(box);
  return out;
}

}  // namespace sbx::network
