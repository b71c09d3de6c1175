#include "runtime/vm/initramfs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "common/fd.h"

namespace sbx::runtime {
namespace {

// One cpio "newc" archive: each entry is a 110-byte ASCII header (magic 070701, then 13 fields of
// 8 hex digits), its NUL-terminated name padded to 4 bytes, its data padded to 4 bytes; the last
// entry is named TRAILER!!!. (The kernel's own reference: Documentation/driver-api/
// early-userspace/buffer-format.rst.)
class Cpio {
 public:
  void Dir(const std::string& name) { Entry(name, S_IFDIR | 0755, ""); }
  void File(const std::string& name, const std::string& data, mode_t mode) {
    Entry(name, S_IFREG | mode, data);
  }
  std::string Finish() {
    Entry("TRAILER!!!", 0, "");
    return std::move(out_);
  }

 private:
  void Entry(const std::string& name, mode_t mode, const std::string& data) {
    char h[111];
    std::snprintf(h, sizeof h, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", ino_++,
                  static_cast<unsigned>(mode), 0u, 0u, S_ISDIR(mode) ? 2u : 1u, 0u,
                  static_cast<unsigned>(data.size()), 0u, 0u, 0u, 0u,
                  static_cast<unsigned>(name.size() + 1), 0u);
    out_.append(h, 110);
    out_.append(name);
    out_.push_back('\0');
    Pad();
    out_.append(data);
    Pad();
  }
  void Pad() {
    while (out_.size() % 4 != 0) out_.push_back('\0');
  }
  std::string out_;
  unsigned ino_ = 1;
};

std::string Base(const std::string& path) {
  std::string b = path.substr(path.rfind('/') + 1);
  for (const char* ext : {".ko.xz", ".ko.zst", ".ko.gz", ".ko"}) {
    const std::string e = ext;
    if (b.size() > e.size() && b.compare(b.size() - e.size(), e.size(), e) == 0)
      return b.substr(0, b.size() - e.size());
  }
  return b;
}

// Module names are spelled with '-' or '_' alike.
std::string Norm(std::string n) {
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

}  // namespace

Result<std::vector<std::string>> ResolveModules(const std::string& modules_dir,
                                                const std::vector<std::string>& wanted) {
  auto dep = ReadFile(modules_dir + "/modules.dep", 16 << 20);
  if (!dep.ok()) return dep.status().Wrap("kernel modules (make deps runs depmod)");
  auto builtin = ReadFile(modules_dir + "/modules.builtin", 16 << 20);
  std::set<std::string> built_in;
  if (builtin.ok()) {
    std::istringstream in(*builtin);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) built_in.insert(Norm(Base(line)));
  }
  // name -> (path, dependency paths)
  std::map<std::string, std::pair<std::string, std::vector<std::string>>> mods;
  std::istringstream in(*dep);
  for (std::string line; std::getline(in, line);) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string path = line.substr(0, colon);
    std::vector<std::string> deps;
    std::istringstream ds(line.substr(colon + 1));
    for (std::string d; ds >> d;) deps.push_back(d);
    mods[Norm(Base(path))] = {path, std::move(deps)};
  }
  std::vector<std::string> out;
  std::set<std::string> done;
  // modules.dep lists every dependency, direct or not, the deepest last: loading them in reverse
  // order, then the module, meets every need first.
  auto add = [&](const std::string& path) {
    if (done.insert(path).second) out.push_back(path);
  };
  for (const auto& w : wanted) {
    const std::string n = Norm(w);
    auto it = mods.find(n);
    if (it == mods.end()) {
      if (built_in.count(n)) continue;
      return Status::Error("kernel module " + w + ": not in " + modules_dir, ENOENT);
    }
    const auto& deps = it->second.second;
    for (auto d = deps.rbegin(); d != deps.rend(); ++d) add(*d);
    add(it->second.first);
  }
  return out;
}

std::string GuestInit() {
  // The box's configuration is /cfg/box.sh, on the disk with serial "cfg" (VmRuntime::Create
  // writes it): SBX_HOSTNAME, SBX_LAYERS, SBX_STACK (1: the layers are the directories 0, 1, ...
  // of the disk with serial "layers"; 0: each is the 9p share l<i>), SBX_PIDS (the box's pids
  // limit, 0 for none: the guest's own pids cgroup, which holds the agent and all it starts;
  // the host's cgroup of QEMU cannot count the guest's processes) and a function sbx_binds
  // calling `bind` (a shared directory), `file` (a file copied into /cfg) and `over`.
  return R"SH(#!/bin/busybox sh
B=/bin/busybox
fail() { echo "sbx-init: $*" >/dev/console; $B poweroff -f; }
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in $($B cat /lib/modules/order); do $B insmod /lib/modules/$m || fail "insmod $m"; done
if $B grep -q sbx.probe /proc/cmdline; then echo sbx-probe-ok >/dev/console; $B poweroff -f; fi
dev() {
  for d in /sys/block/vd*; do
    [ "$($B cat $d/serial 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
  done
  echo /dev/none-$1
}
P="trans=virtio,version=9p2000.L,msize=262144"
$B mkdir -p /cfg /layers /stack /rw
$B mount -t ext4 -o ro,noload "$(dev cfg)" /cfg || fail "mount the box's configuration"
. /cfg/box.sh
[ "$SBX_STACK" = 1 ] && { $B mount -t ext4 -o ro,noload "$(dev layers)" /stack || fail "mount the layers"; }
lower=""
i=0
while [ $i -lt "$SBX_LAYERS" ]; do
  if [ "$SBX_STACK" = 1 ]; then
    l=/stack/$i
  else
    l=/layers/$i
    $B mkdir -p $l && $B mount -t 9p -o ro,cache=loose,$P l$i $l || fail "mount layer $i"
  fi
  [ $i = 0 ] && top=$l
  lower="$lower${lower:+:}$l"
  i=$((i+1))
done
$B mount -t ext4 -o noatime "$(dev rw)" /rw || fail "mount the writable layer"
$B mkdir -p /rw/upper /rw/work
$B mount -t overlay -o lowerdir=$lower,upperdir=/rw/upper,workdir=/rw/work root /newroot || fail "mount the root"
bind() { $B mkdir -p "/newroot$2" && $B mount -t 9p -o ro,cache=loose,$P "$1" "/newroot$2" || fail "bind $2"; }
file() {
  $B mkdir -p "$($B dirname "/newroot$2")" && { [ -e "/newroot$2" ] || $B touch "/newroot$2"; } &&
    $B mount --bind "/cfg/$1" "/newroot$2" && $B mount -o remount,bind,ro "/newroot$2" || fail "bind $2"
}
over() {
  [ -d "$top$1/$2" ] && [ -d "/newroot$1/$2" ] || return 0
  $B mount -t overlay -o ro,lowerdir="$top$1/$2:/newroot$1/$2" over "/newroot$1/$2" || fail "overlay $1/$2"
}
sbx_binds
R=/newroot
$B mkdir -p $R/.sbx $R/proc $R/sys $R/dev $R/tmp
$B mount -t tmpfs -o mode=0755,size=32m sbx $R/.sbx || fail "mount /.sbx"
$B cp /sbx-agent $R/.sbx/sbx-agent && $B chmod 0555 $R/.sbx/sbx-agent && $B mkdir -m 0700 $R/.sbx/run || fail "install the agent"
$B mount -t tmpfs -o mode=0700,size=8m sbxrun $R/.sbx/run && $B mount -o remount,ro $R/.sbx || fail "seal /.sbx"
if [ "${SBX_PIDS:-0}" -gt 0 ]; then
  C=/sys/fs/cgroup
  $B mount -t cgroup2 cgroup2 $C && echo +pids >$C/cgroup.subtree_control && $B mkdir $C/box &&
    echo "$SBX_PIDS" >$C/box/pids.max && echo $$ >$C/box/cgroup.procs || fail "the pids limit"
fi
$B mount -t proc proc $R/proc
$B mount -t sysfs sys $R/sys
$B mount -t devtmpfs dev $R/dev
$B mkdir -p $R/dev/pts $R/dev/shm
$B mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $R/dev/pts
$B mount -t tmpfs -o mode=1777 shm $R/dev/shm
$B hostname "$SBX_HOSTNAME"
$B ip link set lo up
exec $B switch_root $R /.sbx/sbx-agent --listen /.sbx/run/agent.sock --vm-port /dev/vport0p1
)SH";
}

Status WriteInitramfs(const InitramfsInput& in, const std::string& dest) {
  auto busybox = ReadFile(in.busybox, 64 << 20);
  if (!busybox.ok()) return busybox.status().Wrap("busybox for the guest");
  auto agent = ReadFile(in.agent, 256 << 20);
  if (!agent.ok()) return agent.status().Wrap("sbx-agent for the guest");
  std::vector<std::string> wanted(std::begin(kVmGuestModules), std::end(kVmGuestModules));
  auto mods = ResolveModules(in.modules_dir, wanted);
  if (!mods.ok()) return mods.status();
  Cpio c;
  for (const char* d : {"bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules"}) c.Dir(d);
  c.File("bin/busybox", *busybox, 0755);
  c.File("sbx-agent", *agent, 0755);
  c.File("init", GuestInit(), 0755);
  std::string order;
  for (const auto& m : *mods) {
    auto data = ReadFile(in.modules_dir + "/" + m, 64 << 20);
    if (!data.ok()) return data.status().Wrap("kernel module");
    std::string name = m.substr(m.rfind('/') + 1);
    c.File("lib/modules/" + name, *data, 0644);
    order += name + "\n";
  }
  c.File("lib/modules/order", order, 0644);
  std::string tmp = dest + ".new-" + std::to_string(::getpid());
  SBX_RETURN_IF_ERROR(WriteFile(tmp, c.Finish(), 0644));
  if (::rename(tmp.c_str(), dest.c_str()) != 0) {
    Status s = Status::Errno("rename " + tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  return {};
}

}  // namespace sbx::runtime
