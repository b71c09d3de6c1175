// VmRuntime: every box is a QEMU microvm with a kernel of its own (Debian's, unpacked by
// `make deps`), KVM where a probe boot shows it works, TCG otherwise. sbx-agent is the guest's
// PID 1; the rest of sbx reaches it through the box's agent socket as in any other runtime, over a
// virtio-serial port carrying many connections (agent/vm_mux.h). docs/isolation.md, "The vm
// runtime", explains every choice and what was measured to make it.
//
// A box's directory, <run_dir>/<id>/ (root's, 0711: QEMU and the host end of the port run as the
// box's root id and pass through it to what they open by name):
//   owner        locked while the box's creator (or adopter) lives, as the other runtimes'
//   ids          the box's host id base
//   pid, mux.pid QEMU's and the port's host end's pids and start times
//   agent.sock   the box's agent socket: bound here by sbx (root's, 0600), served by the host end
//   port.sock, console.sock, qmp.sock
//                QEMU's listening sockets (root's, 0600; QEMU has them as descriptors): the
//                agent's virtio-serial port and the serial console, which sbx connects and hands
//                to the host end (a new host end can take them over), and QEMU's monitor (QMP)
//   console.log  the guest's serial console (the kernel's and the agent's messages), root's: the
//                host end copies it there from QEMU, keeping it under 1 MiB
//   disk.img     the writable layer: an ext4 image, the box id's (0600), sparse
//   cfg/         the guest's configuration (box.sh: hostname, layers, binds) and copies of the
//                spec's binds of files (f<i>), made into cfg.img (read-only disk "cfg")
//   lower/<i>    read-only bind mounts of the spec's layers (9p tags l<i>), unless the layers are
//                one stack image (below)
//   binds/<i>    read-only bind mounts of its binds of directories (9p tags b<i>)
//   shape        QEMU's arguments that a restore must repeat (a saved box's devices and memory)
// Shared by every box: <run_dir>/.initramfs (busybox, modules, /init, sbx-agent), .sbx-agent (the
// host end's binary), .accel (the accelerator probe's answer for this boot) and .images/ (a
// read-only ext4 image per stack of immutable layers, made on first use, root's 0600: QEMU gets a
// descriptor of it).
//
// A memory snapshot (SaveMemory's `dest`): memory (QEMU's migration stream: the guest's RAM and
// devices), disk.img and cfg.img (copies), shape.
//
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "common/thread_annotations.h"
#include "runtime/id_pool.h"
#include "runtime/native/cgroup.h"
#include "runtime/runtime.h"

namespace sbx::runtime {

struct VmConfig {
  std::string run_dir;     // per-box directories and the shared initramfs
  std::string agent_path;  // a static sbx-agent: the guest's PID 1 and the port's host end
  // The unpacked kernel package: boot/vmlinuz-<release> and lib/modules/<release>/ (make deps).
  std::string kernel_dir = "/var/cache/sbx/vm-kernel";
  std::string qemu = "qemu-system-x86_64";  // a path, or a name looked up on PATH
  std::string busybox = "/bin/busybox";     // static: it is the guest's only userland of its own
  // "kvm", "tcg", or "" (probe: KVM when a probe boot under it answers in time, else TCG).
  std::string accel;
  std::string cgroup_parent = "sbx";
  // Layers under this directory never change (the template store's): a box whose layers all are
  // gets them as one read-only ext4 image of the whole stack, made once and kept in
  // <run_dir>/.images. Other layers, and binds of directories, are 9p shares, which QEMU cannot
  // save: only boxes without them can SaveMemory. "": every layer is a 9p share.
  std::string immutable_layers;
  // Where boxes whose spec names no range get one (not owned). nullptr: they share id_base.
  IdPool* id_pool = nullptr;
  uint32_t id_base = 1000000;
};

class VmRuntime : public Runtime {
 public:
  // Finds QEMU, the kernel and its modules, busybox, setpriv and mke2fs, writes the initramfs
  // and picks the accelerator (a probe boot, remembered for this boot of the host): fails naming
  // what is missing.
  static Result<std::unique_ptr<VmRuntime>> Open(const VmConfig& config);
  ~VmRuntime() override;

  Status CanCreate(const std::string& name) const override;
  Result<Box> Create(const BoxSpec& spec) override;
  // The cgroup freezer stops QEMU itself: the guest, its clock and its devices stand still.
  // accel() and accel_why().
  std::pair<std::string, std::string> Accelerator() const override { return {accel_, accel_why_}; }
  Status Freeze(const Box& box) override;
  size_t MaxLayers(const Box& box) override;
  Status Thaw(const Box& box) override;
  // QEMU's cgroup (what the box costs the host), and the writable layer's image.
  Result<BoxStats> Stats(const Box& box) override;
  Result<uint64_t> OomKills(const Box& box) override;
  // ENOTSUP: the box's sockets are in the guest's kernel.
  Result<UniqueFd> OpenSocket(const Box& box, int domain, int type) override;
  std::optional<std::string> AgentExit(const Box& box) override;
  Status Stop(const Box& box) override;
  Status Destroy(const Box& box) override;
  Result<int> ReapOrphans(const std::string& owner) override;
  Result<Box> Adopt(const std::string& id) override;
  Result<std::vector<std::string>> ListBoxes() override;
  // QEMU's migration to a file, of a stopped guest, after the agent's port has quiesced.
  Status SaveMemory(const Box& box, const std::string& dest, bool stop) override;
  Result<Box> RestoreMemory(const BoxSpec& spec, const std::string& src) override;

  const VmConfig& config() const { return config_; }
  // "kvm" or "tcg", and why (the probe's finding).
  const std::string& accel() const { return accel_; }
  const std::string& accel_why() const { return accel_why_; }
  // The guest kernel's release (uname -r inside a box).
  const std::string& kernel_release() const { return release_; }

 private:
  VmRuntime(VmConfig config, CgroupHost cgroups);
  struct Creation;
  // How a box's layers and binds reach its guest.
  struct Layout {
    bool stack = false;             // the layers are one image (fd 5), else 9p shares l<i>
    std::vector<size_t> dir_binds;  // indices of the spec's binds that are directories (9p b<i>)
  };
  // The host's end of a box's port, started.
  struct HostEnd {
    pid_t pid = -1;
    UniqueFd pidfd;
    UniqueFd ready;  // read end: a byte once the guest's end said hello
  };
  Result<Box> Make(const BoxSpec& spec, const std::string* restore_from);
  Status Prepare(Creation& c);
  Status Launch(Creation& c);
  // Starts the host's end of the port of the box in `dir`, connected to QEMU's listening sockets;
  // `reset`: the guest has run before (vm_mux.h, kReset), re-keyed with `hostname` when not empty.
  Result<HostEnd> StartHostEnd(const std::string& dir, uint32_t base, bool die_with_parent,
                               bool reset, const std::string& hostname, int log_fd);
  // Waits for the guest's hello on `ready` while QEMU and the host end live.
  Status AwaitReady(const std::string& dir, int ready, int qemu_pidfd, int mux_pidfd);
  // The image of a stack of immutable layers (made now when missing).
  Result<std::string> StackImage(const std::vector<std::string>& layers, int log_fd,
                                 const std::string& log_path);
  // The argv of QEMU for a box (or, `spec` null, for the accelerator's probe boot).
  std::vector<std::string> QemuArgs(const std::string& dir, const std::string& accel,
                                    const BoxSpec* spec, const Layout& layout) const;
  // setpriv's argv prefix that runs a program as host id `base` without any privilege.
  std::vector<std::string> AsBox(uint32_t base) const;
  Status ProbeAccel();
  std::string Dir(const std::string& id) const { return config_.run_dir + "/" + id; }

  const VmConfig config_;
  const CgroupHost cgroups_;
  std::string qemu_, setpriv_, mke2fs_, kernel_, release_, accel_, accel_why_;
  Mutex images_mu_;  // one image made at a time
  Mutex mu_;
  std::map<std::string, UniqueFd> owner_locks_ GUARDED_BY(mu_);
  // Per live box this process started: pidfds of its QEMU and its port's host end (children of
  // this process, reaped by Stop and AgentExit).
  std::map<std::string, std::pair<UniqueFd, UniqueFd>> children_ GUARDED_BY(mu_);
};

}  // namespace sbx::runtime
