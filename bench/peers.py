"""The contenders for "create to first command": how each is set up and the command it runs.

Every contender runs /bin/true with the host's /usr read-only as its root's toolchain, in new
namespaces, with a 256 MiB memory and 256 pids limit where it can have one. Differences that
remain are listed in each `isolation` string and repeated in docs/benchmarks.md.
"""

import json
import os
import shutil
import subprocess

MEMORY_BYTES = 256 << 20
PIDS = 256


class Peer:
    def __init__(self, key, label, argv, isolation, env=None, cgroup=None, error=None,
                 api=None, seq_only=False):
        self.key = key              # stable id in results JSON
        self.label = label          # shown in tables and the chart
        self.argv = argv            # "{id}" is replaced by a unique id per run
        self.isolation = isolation  # what this contender sets up, in words
        self.env = env              # extra environment for the launcher (and so the command)
        self.cgroup = cgroup        # sbx-bench-launch -g spec, or None
        self.error = error          # why it cannot run on this host (None: it can)
        self.api = api              # for the REST API rows: extra sbx-bench-api arguments
        self.seq_only = seq_only    # measured sequentially only (diagnostic rows)


def _cgroup_mounts():
    """v1 controller -> (mount point, mount root); "" -> v2 mount point (from mountinfo)."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            lf, rf = left.split(), right.split()
            fstype, opts = rf[0], rf[2].split(",")
            if fstype == "cgroup":
                for o in opts:
                    out.setdefault(o, (lf[4], lf[3]))
            elif fstype == "cgroup2":
                out.setdefault("", (lf[4], lf[3]))
    return out


def own_cgroup_dirs():
    """Our own cgroup directory in every mounted cgroup hierarchy (v1 and v2). runc makes a box's
    cgroup in every v1 hierarchy, not only in those sbx limits."""
    dirs, points = [], set()
    for key, (mnt, _) in _cgroup_mounts().items():
        own = own_cgroup_dir(key) if mnt not in points else None  # None: "rw", "xattr", ...
        if own is not None:
            points.add(mnt)
            dirs.append(own)
    return dirs


def own_cgroup_dir(controller):
    """Our own cgroup directory in the hierarchy of `controller` ("" for v2), or None."""
    mounts = _cgroup_mounts()
    if controller not in mounts:
        return None
    mnt, root = mounts[controller]
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if (controller == "" and ctrls == "") or controller in ctrls.split(","):
                rel = path[len(root):] if root != "/" and path.startswith(root) else path
                return os.path.join(mnt, rel.lstrip("/"))
    return None


def cgroup_mode():
    """'v1', 'v2' or 'hybrid' plus a description of what is where."""
    mounts = _cgroup_mounts()
    v1 = sorted(k for k in mounts if k not in ("", "rw", "relatime", "ro") and
                not k.startswith("name=") and not k.startswith("noprefix"))
    desc = []
    if v1:
        desc.append("v1 controllers: " + ", ".join(v1))
    v2ctl = ""
    if "" in mounts:
        try:
            with open(os.path.join(mounts[""][0], "cgroup.controllers")) as f:
                v2ctl = f.read().strip()
        except OSError:
            pass
        desc.append(f"cgroup2 at {mounts[''][0]} (controllers: {v2ctl or 'none'})")
    mode = "hybrid" if v1 and "" in mounts else ("v1" if v1 else "v2")
    return mode, "; ".join(desc), v2ctl


def cgroup_parents(name):
    """(memory parent, pids parent) directories for per-run cgroups named under `name`."""
    mode, _, _ = cgroup_mode()
    if mode == "v2":
        own = own_cgroup_dir("")
        return (os.path.join(own, name),) * 2 if own else (None, None)
    mem, pids = own_cgroup_dir("memory"), own_cgroup_dir("pids")
    return (os.path.join(mem, name) if mem else None, os.path.join(pids, name) if pids else None)


def _version(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as e:
        return f"unknown ({e})"


def _write_bundle(bundle, runtime):
    """An OCI bundle: a small rootfs directory with the host /usr bind-mounted read-only."""
    rootfs = os.path.join(bundle, "rootfs")
    for d in ("usr", "proc", "dev", "sys", "tmp", "etc"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        p = os.path.join(rootfs, link)
        if not os.path.lexists(p):
            os.symlink("usr/" + link, p)
    os.chmod(bundle, 0o755)
    # Start from the runtime's own default spec, so defaults (masked paths, capabilities,
    # devices) are exactly what the runtime ships.
    subprocess.run([runtime, "spec"], cwd=bundle, check=True, capture_output=True)
    with open(os.path.join(bundle, "config.json")) as f:
        c = json.load(f)
    c["root"] = {"path": "rootfs", "readonly": True}
    c["process"]["args"] = ["/bin/true"]
    c["process"]["terminal"] = False
    c["hostname"] = "box"
    # No cgroupfs inside (sbx mounts none either).
    c["mounts"] = [m for m in c["mounts"] if m["destination"] != "/sys/fs/cgroup"]
    c["mounts"].append({"destination": "/usr", "type": "bind", "source": "/usr",
                        "options": ["rbind", "ro", "nosuid", "nodev"]})
    c["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                        "options": ["nosuid", "nodev"]})
    lin = c["linux"]
    have = {n["type"] for n in lin["namespaces"]}
    for ns in ("pid", "network", "ipc", "uts", "mount", "user", "cgroup"):
        if ns not in have:
            lin["namespaces"].append({"type": ns})
    # Like sbx: root inside is uid/gid 1000000 outside, 65536 ids mapped.
    lin["uidMappings"] = [{"containerID": 0, "hostID": 1000000, "size": 65536}]
    lin["gidMappings"] = [{"containerID": 0, "hostID": 1000000, "size": 65536}]
    lin.setdefault("resources", {})
    lin["resources"]["memory"] = {"limit": MEMORY_BYTES, "swap": MEMORY_BYTES}
    lin["resources"]["pids"] = {"limit": PIDS}
    # No cgroupsPath: the runtime makes <own cgroup>/<container id> in each hierarchy.
    lin.pop("cgroupsPath", None)
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(c, f, indent=1)


def make_peers(build_dir, tmp, pid):
    """All contenders, in table order. Setup failures become Peer.error, never an omission."""
    peers = []
    versions = {}
    sbx = os.path.join(build_dir, "sbx")
    data = os.path.join(tmp, "sbx-data")
    os.makedirs(data, mode=0o711, exist_ok=True)
    os.chmod(data, 0o711)
    versions["sbx"] = _git_describe()
    peers.append(Peer(
        "sbx", "sbx run", [sbx, "--data-dir", data, "run", "--memory", "256M", "--pids", "256",
                           "--timings", "--", "/bin/true"],
        "user (0 -> 1000000, 65536 ids), pid, mount, uts, ipc, net, cgroup namespaces; overlay "
        "root (host template: /usr ro + generated /etc) with a writable layer; new /proc, /sys, "
        "/dev; seccomp allow-list; capabilities dropped; memory 256 MiB + pids 256 (cgroup); "
        "sbx-agent as PID 1, the command spawned by it",
        env={"SBX_CGROUP_PARENT": f"sbx-bench-{pid}"},
        error=None if os.access(sbx, os.X_OK) else f"{sbx} is missing or not executable"))

    bwrap = shutil.which("bwrap")
    versions["bwrap"] = _version([bwrap, "--version"]) if bwrap else "not installed"
    bwrap_argv = [bwrap or "bwrap", "--unshare-all", "--die-with-parent",
                  "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
                  "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                  "--symlink", "usr/sbin", "/sbin", "--proc", "/proc", "--dev", "/dev",
                  "--tmpfs", "/tmp", "--", "/bin/true"]
    bw_iso = ("--unshare-all (user 0 -> 0 single id, pid, mount, uts, ipc, net, cgroup); tmpfs "
              "root with /usr ro-bound, /proc, /dev; no seccomp, no /etc")
    no_bwrap = None if bwrap else "bwrap is not installed (apt-get install bubblewrap)"
    peers.append(Peer("bwrap", "bwrap (no limits)", bwrap_argv, bw_iso + "; no cgroup limits",
                      error=no_bwrap))
    mem, pidsdir = cgroup_parents(f"sbx-bench-bwrap-{pid}")
    cg_err = no_bwrap
    if not cg_err and (mem is None or pidsdir is None):
        cg_err = "no memory or pids cgroup controller found for our own cgroup"
    if not cg_err:
        try:
            os.makedirs(mem, exist_ok=True)
            os.makedirs(pidsdir, exist_ok=True)
        except OSError as e:
            cg_err = f"cannot make the per-run cgroup parents: {e}"
    peers.append(Peer("bwrap-cg", "bwrap + cgroup", bwrap_argv,
                      bw_iso + "; plus a fresh memory (256 MiB) and pids (256) cgroup made, "
                      "joined and removed per run by the launcher",
                      cgroup=f"{mem}:{pidsdir}:{MEMORY_BYTES}:{PIDS}", error=cg_err))

    for rt in ("runc", "crun"):
        exe = shutil.which(rt)
        versions[rt] = _version([exe, "--version"]) if exe else "not installed"
        err = None
        bundle = os.path.join(tmp, f"oci-{rt}")
        if not exe:
            err = f"{rt} is not installed (apt-get install -y {rt})"
        else:
            try:
                _write_bundle(bundle, exe)
            except (OSError, subprocess.CalledProcessError, KeyError, ValueError) as e:
                err = f"could not write the OCI bundle: {e}"
        peers.append(Peer(
            rt, rt, [exe or rt, "run", "--bundle", bundle, f"sbx-bench-{rt}-{{id}}"],
            "OCI bundle from `" + rt + " spec`: pid, net, ipc, uts, mount, user (0 -> 1000000, "
            "65536 ids), cgroup namespaces; rootfs directory read-only with host /usr bound "
            "ro; default masked/readonly paths and capabilities; no seccomp profile; memory "
            "256 MiB + pids 256 (cgroup made by the runtime)", error=err))

    peers.append(Peer("fork-exec", "fork+exec (floor)", ["/bin/true"],
                      "none: the launcher forks and execs /bin/true"))
    return peers, versions


def crun_hybrid_explanation():
    """Why crun refuses this host, when it is the hybrid-cgroup check."""
    mode, _, v2ctl = cgroup_mode()
    if mode == "hybrid" and v2ctl:
        return (f"crun refuses every container on a hybrid cgroup host whose cgroup2 mount "
                f"has a controller enabled (here: {v2ctl}), before looking at its cgroup manager "
                "(even --cgroup-manager=disabled); see libcrun/cgroup.c. Fixing it means "
                "moving that controller off the unified hierarchy host-wide, which the "
                "benchmark does not do.")
    return None


def _git_describe():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "src"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"git {rev}" + (" + uncommitted changes in src/" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
